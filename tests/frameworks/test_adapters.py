"""The three framework adapters through the conformance kit: agent files written as each
framework documents them run unedited, handed only the model client."""

from __future__ import annotations

import time
import warnings

import pytest

from agentgym_lightning.testing.conformance import no_network
from agentgym_lightning.env import AgentEnv

TASK = "What is 2 + 3?"


def _langchain():
    pytest.importorskip("langgraph", reason="needs the [langchain] extra")
    from agentgym_lightning.plugins.langchain_adapter import LangChainAgent

    return LangChainAgent


def _openai_agents():
    pytest.importorskip("agents", reason="needs the [openai-agents] extra")
    from agentgym_lightning.plugins.openai_agents_adapter import OpenAIAgentsAgent

    return OpenAIAgentsAgent


def _autogen():
    pytest.importorskip("autogen_agentchat", reason="needs the [autogen] extra")
    from agentgym_lightning.plugins.autogen_adapter import AutoGenAgent

    return AutoGenAgent


def _check(report, agent_name):
    report.assert_ok()
    steps = report.trajectory.steps
    assert len(steps) == 2  # the tool call, then the answer after its result
    assert steps[0].completion.tool_calls and steps[0].request.tools
    assert steps[1].request.messages[-1]["role"] == "tool" and steps[1].request.messages[-1]["content"] == "2"
    assert report.trajectory.result == "Answer: 2"
    assert [s.agent for s in steps] == [agent_name, agent_name]


@pytest.mark.parametrize("streaming", [False, True], ids=["plain", "streaming"])
def test_langgraph_agent_file_runs_unedited(agent_conformance, agent_file, streaming):
    LangChainAgent = _langchain()
    module = agent_file("langgraph_calculator")
    report = agent_conformance(LangChainAgent(module.agent, streaming=streaming), TASK)
    _check(report, "assistant")  # the LangGraph node that made the calls
    assert all(s.request.stream is streaming for s in report.trajectory.steps)


@pytest.mark.parametrize("streaming", [False, True], ids=["plain", "streaming"])
def test_openai_agents_file_runs_unedited(agent_conformance, agent_file, streaming):
    OpenAIAgentsAgent = _openai_agents()
    module = agent_file("openai_agents_calculator")
    if streaming:
        from agents import Runner

        async def streamed(task, model):
            run = Runner.run_streamed(module.solver.clone(model=model), task)
            async for _event in run.stream_events():
                pass
            return run.final_output

        agent = OpenAIAgentsAgent(streamed)
    else:
        agent = OpenAIAgentsAgent(module.agent)
    report = agent_conformance(agent, TASK)
    _check(report, "solver")  # the SDK agent's name
    assert all(s.request.stream is streaming for s in report.trajectory.steps)


def test_openai_agents_sdk_agent_object_runs_as_it_is(agent_conformance, agent_file):
    _openai_agents()
    module = agent_file("openai_agents_calculator")
    # Zero code: the SDK's own Agent object is the env's agent.
    _check(agent_conformance(module.solver, TASK), "solver")


@pytest.mark.parametrize("streaming", [False, True], ids=["plain", "streaming"])
def test_autogen_agent_file_runs_unedited(agent_conformance, agent_file, streaming):
    AutoGenAgent = _autogen()
    module = agent_file("autogen_calculator")
    fn = module.agent
    if streaming:
        from autogen_agentchat.agents import AssistantAgent

        async def fn(task, model_client):
            solver = AssistantAgent("solver", model_client=model_client, tools=[module.calculator],
                                    reflect_on_tool_use=True, model_client_stream=True)
            return (await solver.run(task=task)).messages[-1].content

    report = agent_conformance(AutoGenAgent(fn, metadata={"agent": "solver"}), TASK)
    _check(report, "solver")
    assert all(s.request.stream is streaming for s in report.trajectory.steps)


def test_adapters_run_on_the_shared_event_loop_not_a_thread(agent_file):
    """Async framework agents are tasks on the gateway's loop: no agent-* thread per episode."""
    LangChainAgent = _langchain()
    import threading

    module = agent_file("langgraph_calculator")
    env = AgentEnv(LangChainAgent(module.agent), [TASK], lambda t, r: 1.0)
    try:
        obs, _ = env.reset(seed=0)
        assert not [t for t in threading.enumerate() if t.name.startswith("agent-")]
        assert threading.current_thread() is not env.gateway.background_loop()._thread
    finally:
        env.close()


def test_tracing_reaches_the_episode_and_nothing_leaves(agent_conformance, agent_file, monkeypatch):
    """LangSmith and the Agents SDK's exporter would post to their clouds: nothing leaves
    127.0.0.1. With the tracing extra, the frameworks' traces reach their episodes instead: the
    calculator's tool span is a semantic variable of the call that asked for it."""
    LangChainAgent = _langchain()
    OpenAIAgentsAgent = _openai_agents()
    pytest.importorskip("openinference.instrumentation.langchain", reason="needs the [langchain] extra")
    monkeypatch.setenv("LANGSMITH_TRACING", "true")
    monkeypatch.setenv("LANGCHAIN_TRACING_V2", "true")
    monkeypatch.setenv("LANGSMITH_API_KEY", "lsv2-test-not-a-key")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-key")
    with no_network() as outside:
        for agent in (LangChainAgent(agent_file("langgraph_calculator").agent),
                      OpenAIAgentsAgent(agent_file("openai_agents_calculator").agent)):
            report = agent_conformance(agent, TASK)
            report.assert_ok()
            first, second = report.trajectory.steps
            (tool,) = first.outcome["otel.tools"]
            assert tool["name"] == "calculator" and tool["status"] == "ok" and "2" in str(tool["result"])
            assert "otel.tools" not in second.outcome and report.trajectory.spans
        time.sleep(1.0)  # exporters flush from background threads
    assert outside == []
    from agents.tracing import get_trace_provider

    # The SDK's own exporter to api.openai.com (a BatchTraceProcessor) is no longer registered.
    registered = get_trace_provider()._multi_processor._processors
    assert [type(p).__name__ for p in registered] == ["OpenInferenceTracingProcessor"]


def test_the_kit_finds_broken_agents(agent_conformance):
    """The kit's checks fail when they should: a dropped tool result, a reach for the network."""
    import socket

    def forgets_tool_results(task, ctx):
        client = ctx.openai_client()
        tools = [{"type": "function", "function": {"name": "calculator", "parameters": {
            "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]
        client.chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": task}], tools=tools)
        reply = client.chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": task}])
        return reply.choices[0].message.content

    problems = agent_conformance(forgets_tool_results, TASK, transport="inproc").problems
    assert any("not in call 1's messages" in p for p in problems)
    assert any("no tool message" in p for p in problems)

    def phones_home(task, ctx):
        try:
            socket.getaddrinfo("telemetry.example.com", 443)
        except OSError:
            pass
        reply = ctx.openai_client().chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": task}])
        ctx.emit_variable("answer", reply.choices[0].message.content)
        return reply.choices[0].message.content

    report = agent_conformance(phones_home, TASK, expect_variables=["answer", "never_emitted"], transport="inproc")
    assert report.outside_connections == ["telemetry.example.com"]
    assert any("beyond 127.0.0.1" in p for p in report.problems)
    assert any(p.startswith("variables never emitted: ['never_emitted']") for p in report.problems)
    with pytest.raises(AssertionError, match="does not conform"):
        report.assert_ok()


def test_missing_extra_says_what_to_install(monkeypatch):
    import importlib.util as util

    from agentgym_lightning.framework_agent import require_extra

    real = util.find_spec
    monkeypatch.setattr(util, "find_spec", lambda name, *a: None if name == "langchain_openai" else real(name, *a))
    with pytest.raises(ImportError, match=r"pip install 'agentgym-lightning\[langchain\]'"):
        require_extra("langchain", "langchain_openai")


@pytest.mark.parametrize(
    ("env_id", "agent", "module", "extra"),
    [
        ("lightning/Arithmetic-v0", "autogen", "autogen_ext", "autogen"),
        ("lightning/Spider-v0", "langgraph", "langchain_openai", "langchain"),
        ("lightning/MuSiQue-v0", "openai-agents", "agents", "openai-agents"),
    ],
)
def test_an_env_whose_framework_is_missing_fails_when_built_not_in_every_episode(monkeypatch, env_id, agent, module, extra):
    # A trainer given such an env used to run every step with every episode failing on the
    # same ImportError and report reward 0.0 -> 0.0.
    import importlib.util as util

    import gymnasium as gym

    import agentgym_lightning  # noqa: F401 - registers the ids

    real = util.find_spec
    monkeypatch.setattr(util, "find_spec", lambda name, *a: None if name == module else real(name, *a))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refused before any data is looked for (no "no data" warning spent)
        with pytest.raises(ImportError, match=rf"pip install 'agentgym-lightning\[{extra}\]'"):
            gym.make(env_id, agent=agent)


def test_autogen_names_its_calls_from_its_own_spans_without_metadata(agent_conformance, agent_file):
    """AutoGen cannot say who calls its model client, but its agents trace themselves
    (``invoke_agent``, ``gen_ai.agent.name``): the in-process span processor names every call,
    and its ``execute_tool`` span becomes a semantic variable of the call that asked for the tool."""
    AutoGenAgent = _autogen()
    pytest.importorskip("opentelemetry.sdk", reason="needs the [tracing] extra")
    module = agent_file("autogen_calculator")
    report = agent_conformance(AutoGenAgent(module.agent), TASK)  # no metadata={"agent": ...}
    _check(report, "solver")
    first, second = report.trajectory.steps
    (tool,) = first.outcome["otel.tools"]
    assert tool["name"] == "calculator" and tool["status"] == "ok"
    assert tool["call_id"] == first.completion.tool_calls[0].id  # joined by the tool call's id
    assert first.outcome["otel.tool_ok"] == 1 and "otel.tool_error" not in first.outcome
    assert "otel.tools" not in second.outcome


def test_autogens_model_mismatch_warning_is_said_once_not_on_every_call(agent_file):
    # The episode tells AutoGen a stand-in model name and the policy answers under its own: AutoGen's
    # client warned "Resolved model mismatch" on every response (2 of 4 here, every one in a run).
    AutoGenAgent = _autogen()
    from agentgym_lightning import AgentEnv, Completion, rollout

    module = agent_file("autogen_calculator")

    def policy(requests):
        return [Completion(text="The answer is 4.", model="served/smollm2", prompt_token_ids=[1], completion_token_ids=[2], logprobs=[-0.1])
                for _ in requests]

    def make():
        # a name of this test's own: Python's "once" registry outlives the test
        return AgentEnv(AutoGenAgent(module.agent), tasks=["What is 2+2?"] * 4, reward_fn=lambda task, result: 1.0,
                        model_name="mismatch-once-test")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        trajectories = rollout(make, policy, episodes=4, concurrency=2, progress=False)
    assert [t.status.value for t in trajectories] == ["succeeded"] * 4
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if m.startswith("Resolved model mismatch: mismatch-once-test")]
    said = [m for m in messages if "told the model 'mismatch-once-test'" in m]
    assert len(said) == 1 and "Resolved model mismatch" in said[0]
    # a user's own client asking for another name keeps its warnings
    assert not any(getattr(f[1], "pattern", "").startswith("Resolved model mismatch: gpt") for f in warnings.filters)
