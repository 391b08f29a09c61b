"""Agents on every wire through the conformance kit, unmodified, scripted policy, no network: the
``openai`` SDK's Responses API and legacy Completions, the ``anthropic`` SDK with a tool,
pydantic-ai on its default model and the OpenAI Agents SDK on its default model (both the
Responses API)."""

from __future__ import annotations

import json

import pytest

TASK = "What is 2 + 3?"
SCHEMA = {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}


def calculator(expression: str) -> str:
    return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 - a test tool


def check(report, wire):
    report.assert_ok()
    steps = report.trajectory.steps
    assert report.wires == [wire] * len(steps)
    assert len(steps) == 2 and steps[0].completion.tool_calls
    assert steps[1].request.messages[-1] == {
        "role": "tool",
        "tool_call_id": steps[0].completion.tool_calls[0].id,
        "content": "2",
    }
    assert report.trajectory.result == "Answer: 2"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streaming"])
def test_an_openai_responses_agent_conforms(agent_conformance, stream):
    def agent(task, ctx):
        client = ctx.openai_client()
        tools = [{"type": "function", "name": "calculator", "description": "Compute.", "parameters": SCHEMA}]
        response_id, pending = None, task
        while True:
            kwargs = {"model": ctx.model, "input": pending, "tools": tools, "previous_response_id": response_id}
            if stream:
                events = list(client.responses.create(**kwargs, stream=True))
                r = next(e.response for e in events if e.type == "response.completed")
            else:
                r = client.responses.create(**kwargs)
            calls = [item for item in r.output if item.type == "function_call"]
            if not calls:
                return r.output_text
            response_id = r.id
            pending = [
                {"type": "function_call_output", "call_id": c.call_id, "output": calculator(**json.loads(c.arguments))}
                for c in calls
            ]

    check(agent_conformance(agent, TASK, expect_wire="responses"), "responses")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streaming"])
def test_an_anthropic_agent_with_a_tool_conforms(agent_conformance, stream):
    pytest.importorskip("anthropic", reason="needs the [anthropic] extra")

    def agent(task, ctx):
        client = ctx.anthropic_client()
        tools = [{"name": "calculator", "description": "Compute.", "input_schema": SCHEMA}]
        messages = [{"role": "user", "content": task}]
        while True:
            if stream:
                with client.messages.stream(model=ctx.model, max_tokens=256, messages=messages, tools=tools) as s:
                    r = s.get_final_message()
            else:
                r = client.messages.create(model=ctx.model, max_tokens=256, messages=messages, tools=tools)
            if r.stop_reason != "tool_use":
                return "".join(b.text for b in r.content if b.type == "text")
            messages.append({"role": "assistant", "content": r.content})
            results = [
                {"type": "tool_result", "tool_use_id": b.id, "content": calculator(**b.input)}
                for b in r.content
                if b.type == "tool_use"
            ]
            messages.append({"role": "user", "content": results})

    check(agent_conformance(agent, TASK, expect_wire="messages"), "messages")


def test_pydantic_ai_on_its_default_model_conforms(agent_conformance, monkeypatch):
    pytest.importorskip("pydantic_ai", reason="needs the [pydantic-ai] extra")
    from pydantic_ai import Agent
    from pydantic_ai.models import infer_model
    from pydantic_ai.models.openai import OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    monkeypatch.setenv("OPENAI_API_KEY", "unused")
    assert type(infer_model("openai:policy")) is OpenAIResponsesModel  # what Agent("openai:...") runs on

    async def agent(task, ctx):
        model = OpenAIResponsesModel(ctx.model, provider=OpenAIProvider(openai_client=ctx.async_openai_client()))
        solver = Agent(model, instructions="Use the calculator, then answer.", tools=[calculator])
        return (await solver.run(task)).output

    check(agent_conformance(agent, TASK, expect_wire="responses"), "responses")


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_the_agents_sdk_runs_on_its_default_responses_model(agent_conformance, agent_file, api):
    pytest.importorskip("agents", reason="needs the [openai-agents] extra")
    from agentgym_lightning.plugins.openai_agents_adapter import OpenAIAgentsAgent

    solver = agent_file("openai_agents_calculator").solver
    # The SDK's own Agent object, as it is; "chat" is the opt-in older model.
    agent = solver if api == "responses" else OpenAIAgentsAgent(solver, api="chat")
    report = agent_conformance(agent, TASK, expect_wire=api)
    check(report, api)
    assert [s.agent for s in report.trajectory.steps] == ["solver", "solver"]


def test_a_legacy_completions_agent_conforms(agent_conformance):
    def agent(task, ctx):
        return (
            ctx.openai_client().completions.create(model=ctx.model, prompt=f"Q: {task}\nA:", max_tokens=16).choices[0].text
        )

    report = agent_conformance(agent, TASK, expect_wire="completions")
    report.assert_ok()
    assert report.trajectory.steps[0].request.prompt == f"Q: {TASK}\nA:" and report.trajectory.result == "Answer: 2"


def test_the_kit_reports_a_call_on_another_wire(agent_conformance):
    def agent(task, ctx):
        return ctx.openai_client().chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": task}])

    report = agent_conformance(agent, TASK, expect_wire="responses")
    assert report.problems == ["call 0 came on the 'chat' wire, expected 'responses'"]


def test_the_agents_sdk_models_give_the_policy_the_same_prompt(agent_conformance, agent_file):
    """Switching the adapter's default from the SDK's Chat Completions model to its Responses
    model changes nothing the policy renders: the same messages and tools, call by call."""
    pytest.importorskip("agents", reason="needs the [openai-agents] extra")
    from agentgym_lightning.plugins.openai_agents_adapter import OpenAIAgentsAgent

    solver = agent_file("openai_agents_calculator").solver
    runs = [agent_conformance(OpenAIAgentsAgent(solver, api=api), TASK).trajectory.steps for api in ("chat", "responses")]
    assert [(s.request.messages, s.request.tools) for s in runs[0]] == [
        (s.request.messages, s.request.tools) for s in runs[1]
    ]
