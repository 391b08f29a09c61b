"""Per-call overhead of each framework's model client through the gateway, versus plain ``openai``.

An instant scripted policy answers every call ("ok"), so what is measured is the agent side of a
call: building the request, the gateway round trip, parsing the answer. Each variant is an agent
that makes ``--calls`` calls in a row, through the adapter's client (in-process transport):

- ``openai`` (sync) and ``openai-async``: ``ctx.openai_client()`` / ``ctx.async_openai_client()``,
  the baseline;
- ``langchain``: ``ChatOpenAI.ainvoke`` (the LangChain adapter's client);
- ``openai-agents``: ``Runner.run`` of a one-call ``Agent`` (the SDK's model is not meant to be
  called alone, so this is the SDK's cost per model call including its run loop);
- ``autogen``: ``OpenAIChatCompletionClient.create``, and ``autogen-agent``: ``AssistantAgent.run``.

Variants are interleaved over ``--repeats`` rounds in one run; the table shows the median
microseconds per call (wall time of the whole episode / calls, the driver's stepping included)
and the ratio to the plain sync ``openai`` client measured in the same run.

    python bench/bench_frameworks.py [--calls 300] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from agentgym_lightning.env import AgentEnv

MESSAGES = [{"role": "user", "content": "hi"}]


def openai_sync(task: dict[str, Any], ctx: Any) -> None:
    client = ctx.openai_client()
    for _ in range(task["calls"]):
        client.chat.completions.create(model=ctx.model, messages=MESSAGES)


async def openai_async(task: dict[str, Any], ctx: Any) -> None:
    client = ctx.async_openai_client()
    for _ in range(task["calls"]):
        await client.chat.completions.create(model=ctx.model, messages=MESSAGES)
    await client.close()


def variants() -> dict[str, Any]:
    found: dict[str, Any] = {"openai": openai_sync, "openai-async": openai_async}
    try:
        from agentgym_lightning.plugins.langchain_adapter import LangChainAgent

        async def langchain(task: dict[str, Any], llm: Any) -> None:
            for _ in range(task["calls"]):
                await llm.ainvoke("hi")

        found["langchain"] = LangChainAgent(langchain)
    except ImportError:
        pass
    try:
        from agents import Agent, Runner

        from agentgym_lightning.plugins.openai_agents_adapter import OpenAIAgentsAgent

        async def openai_agents(task: dict[str, Any], model: Any) -> None:
            agent = Agent(name="bench", instructions="Reply.", model=model)
            for _ in range(task["calls"]):
                await Runner.run(agent, "hi")

        found["openai-agents"] = OpenAIAgentsAgent(openai_agents)
    except ImportError:
        pass
    try:
        from autogen_agentchat.agents import AssistantAgent
        from autogen_core.models import UserMessage

        from agentgym_lightning.plugins.autogen_adapter import AutoGenAgent

        async def autogen(task: dict[str, Any], client: Any) -> None:
            for _ in range(task["calls"]):
                await client.create([UserMessage(content="hi", source="user")])

        async def autogen_agent(task: dict[str, Any], client: Any) -> None:
            for _ in range(task["calls"]):
                await AssistantAgent("bench", model_client=client).run(task="hi")

        found["autogen"] = AutoGenAgent(autogen)
        found["autogen-agent"] = AutoGenAgent(autogen_agent)
    except ImportError:
        pass
    return found


def per_call_us(agent: Any, calls: int) -> float:
    env = AgentEnv(agent, [{"calls": calls}], lambda t, r: 0.0, time_limit=None)
    try:
        start = time.perf_counter()
        env.reset(seed=0)
        steps = 0
        while True:
            _, _, terminated, truncated, info = env.step("ok")
            steps += 1
            if terminated or truncated:
                break
        elapsed = time.perf_counter() - start
    finally:
        env.close()
    if info["status"] != "succeeded" or steps != calls:
        raise RuntimeError(f"{agent!r}: {info['status']} after {steps} steps: {info['error']}")
    return elapsed / calls * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    found: dict[str, Callable[..., Any]] = variants()
    for agent in found.values():  # warm up: imports, first-use costs
        per_call_us(agent, 5)
    samples: dict[str, list[float]] = {name: [] for name in found}
    for _ in range(args.repeats):
        for name, agent in found.items():
            samples[name].append(per_call_us(agent, args.calls))
    base = statistics.median(samples["openai"])
    print(f"per-call cost through the gateway (in-process), instant policy, {args.calls} calls x {args.repeats} rounds")
    print(f"{'client':<16}{'us/call (median)':>18}{'min':>10}{'max':>10}{'x openai':>10}")
    for name, values in samples.items():
        med = statistics.median(values)
        print(f"{name:<16}{med:>18.0f}{min(values):>10.0f}{max(values):>10.0f}{med / base:>10.2f}")


if __name__ == "__main__":
    main()
