"""What the gateway costs per model call of a verifiers rollout, next to the same rollout sent to
the policy directly.

    .venv-verifiers/bin/python bench/bench_verifiers_overhead.py   # 3 interleaved rounds of 40 rollouts a path

The rollout is the tests' ``vf.ToolEnv`` (``tests/verifiers_env/environments/vf_calculator.py``):
two model calls (a ``multiply`` tool call, then the answer) with the environment running its tool
in between, then its rubric. Every answer is instant and the same, so what is timed is the
machinery around the model, per call:

* **direct**: ``Environment.run_rollout`` with its client pointed at an OpenAI-compatible server
  answering at once (``MockOpenAIServer``, over a socket): verifiers as it runs without us;
* **ours-http**: the same rollout as an episode (``--env verifiers:vf_calculator``), its client
  reaching the gateway over a socket (``transport="http"``), each call answered by the driver;
* **ours-inproc**: the same, in-process (the default: no socket).

Printed: milliseconds per model call (median of the rounds) and each path's ratio to direct.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "verifiers_env" / "environments"))

from agentgym_lightning import Completion, ToolCall  # noqa: E402
from agentgym_lightning.registration import make_env_factory, resolve_env_id  # noqa: E402
from agentgym_lightning.testing.mock_openai_server import MockOpenAIServer, default_reply  # noqa: E402

CALLS_PER_ROLLOUT = 2
TOOL_CALL = ToolCall(id="call-1", name="multiply", arguments={"a": 3, "b": 7})


def mock_answer(body: dict[str, Any]) -> dict[str, Any]:
    """The direct path's server: the tool call first, then the answer (as the episode's policy)."""
    if any(m.get("role") == "tool" for m in body.get("messages") or []):
        return default_reply(body, "21")
    reply = default_reply(body, "")
    reply["choices"][0]["message"] = {"role": "assistant", "content": None, "tool_calls": [
        {"id": TOOL_CALL.id, "type": "function", "function": {"name": TOOL_CALL.name, "arguments": TOOL_CALL.arguments}}
    ]}
    reply["choices"][0]["finish_reason"] = "tool_calls"
    return reply


def direct(rollouts: int, base_url: str) -> float:
    """Seconds for ``rollouts`` rollouts of verifiers alone, against the instant server."""
    import verifiers as vf
    from openai import AsyncOpenAI
    from vf_calculator import load_environment

    environment = load_environment()
    row = dict(environment.get_dataset()[0])

    async def run() -> float:
        client = vf.OpenAIChatCompletionsClient(AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0))
        start = time.perf_counter()
        for _ in range(rollouts):
            output = await environment.run_rollout(row, client, "policy", {})
            assert output["reward"] == 1.0, output
        return time.perf_counter() - start

    return asyncio.run(run())


def ours(rollouts: int, transport: str) -> float:
    """Seconds for ``rollouts`` episodes of ``verifiers:vf_calculator``, each call answered at once."""
    env = make_env_factory(resolve_env_id("verifiers:vf_calculator"), {"transport": transport})()
    try:
        start = time.perf_counter()
        for _ in range(rollouts):
            env.reset(seed=0, options={"task_index": 0})
            env.step(Completion(tool_calls=[TOOL_CALL]))
            _, _, _, _, info = env.step("21")
            assert info["final_reward"] == 1.0, info["error"]
        return time.perf_counter() - start
    finally:
        env.close()


def one_round(rollouts: int, base_url: str) -> dict[str, float]:
    """Seconds per model call of each path, the paths run one after the other."""
    calls = rollouts * CALLS_PER_ROLLOUT
    return {
        "direct": direct(rollouts, base_url) / calls,
        "ours-http": ours(rollouts, "http") / calls,
        "ours-inproc": ours(rollouts, "inproc") / calls,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=40, help="rollouts per path and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with MockOpenAIServer(mock_answer) as server:
        one_round(3, server.base_url)  # warm up: imports, connections
        rounds = [one_round(args.rollouts, server.base_url) for _ in range(args.rounds)]
    medians = {path: statistics.median(r[path] for r in rounds) for path in rounds[0]}
    print(f"per model call of a verifiers ToolEnv rollout (median of {args.rounds} rounds of {args.rollouts} rollouts):")
    print("\n".join(f"  {path:<12} {m * 1e3:7.2f} ms  ({m / medians['direct']:.2f}x direct)" for path, m in medians.items()))


if __name__ == "__main__":
    main()
