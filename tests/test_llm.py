"""The action's data model as a new user writes it: tool calls in either shape, finish reasons."""

from __future__ import annotations

import json

import pytest

from agentgym_lightning import Completion, ToolCall
from agentgym_lightning.env import AgentEnv


def test_a_completion_with_tool_calls_finishes_with_tool_calls_unless_told_otherwise():
    call = ToolCall(id="c1", name="calculator", arguments='{"x": 1}')
    assert Completion(tool_calls=[call]).finish_reason == "tool_calls"
    assert Completion(text="hi").finish_reason == "stop"
    assert Completion(tool_calls=[call], finish_reason="length").finish_reason == "length"


def test_the_agent_sees_finish_reason_tool_calls():
    def agent(task, ctx):
        reply = ctx.openai_client().chat.completions.create(model="m", messages=[{"role": "user", "content": "2+2"}])
        return reply.choices[0].finish_reason, reply.choices[0].message.tool_calls[0].function.name

    env = AgentEnv(agent, [{}])
    env.reset(seed=0)
    *_, info = env.step(Completion(tool_calls=[ToolCall(id="c1", name="calculator", arguments="{}")]))
    assert info["trajectory"].result == ("tool_calls", "calculator")


@pytest.mark.parametrize(
    "shape",
    [
        {"id": "c1", "name": "calculator", "arguments": {"expr": "2+2"}},
        {"id": "c1", "name": "calculator", "arguments": '{"expr": "2+2"}'},
        {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": '{"expr": "2+2"}'}},
        {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": {"expr": "2+2"}}},
    ],
    ids=["flat-dict", "flat-json", "openai-json", "openai-dict"],
)
def test_from_dict_reads_the_flat_and_the_openai_shape(shape):
    c = Completion.from_dict({"tool_calls": [shape]})
    assert [(t.id, t.name, json.loads(t.arguments)) for t in c.tool_calls] == [("c1", "calculator", {"expr": "2+2"})]
    assert c.finish_reason == "tool_calls"
    assert ToolCall.from_dict(shape) == c.tool_calls[0]


def test_a_tool_call_without_an_id_gets_one_and_mappings_become_json():
    call = ToolCall.from_dict({"name": "f"})
    assert call.id.startswith("call_") and call.arguments == "{}"
    assert ToolCall(id="x", name="f", arguments={"a": [1]}).arguments == '{"a": [1]}'


@pytest.mark.parametrize(
    "bad, fragment",
    [
        ("calculator", "must be an object"),
        ({"id": "c1", "arguments": "{}"}, "got keys"),
        ({"id": "c1", "name": "", "arguments": "{}"}, "non-empty string 'name'"),
        ({"id": "c1", "name": 3}, "non-empty string 'name'"),
        ({"id": "c1", "name": "f", "arguments": [1, 2]}, "'arguments' must be"),
        ({"id": "c1", "function": "f"}, "'function' must be an object"),
        ({"id": "c1", "type": "custom", "function": {"name": "f"}}, "only 'function'"),
        ({"id": 7, "name": "f"}, "'id' must be a string"),
        ({"id": "c1", "name": "f", "args": {}}, "unexpected keys"),
    ],
)
def test_anything_else_is_rejected_with_a_clear_error(bad, fragment):
    with pytest.raises(ValueError, match=fragment):
        Completion.from_dict({"tool_calls": [bad]})
    with pytest.raises(ValueError, match=fragment):
        ToolCall.from_dict(bad)


def test_tool_calls_must_be_a_list():
    with pytest.raises(ValueError, match="list of tool calls"):
        Completion(tool_calls={"name": "f"})  # type: ignore[arg-type]


def test_ids_extend_checks_a_prompt_against_the_previous_prompt_and_completion():
    from agentgym_lightning.llm import ids_extend

    assert ids_extend([1, 2, 3, 4], [1, 2], [3])
    assert ids_extend([1, 2, 3], [1, 2], [3])  # equal is extending
    assert ids_extend((1, 2, 3), [1, 2], (3,))  # lists and tuples alike
    assert not ids_extend([1, 2], [1, 2], [3])
    assert not ids_extend([1, 9, 3, 4], [1, 2], [3])
    assert not ids_extend([1, 2, 9, 4], [1, 2], [3])
    assert ids_extend([5], [])


def test_common_prefix_length_counts_what_every_sequence_shares():
    from agentgym_lightning.llm import common_prefix_length

    assert common_prefix_length([1, 2, 3], [1, 2, 4], [1, 2]) == 2
    assert common_prefix_length([1, 2], (1, 2, 3)) == 2  # lists and tuples compare item by item
    assert common_prefix_length([{"role": "user"}], [{"role": "system"}]) == 0
    assert common_prefix_length([5, 6]) == 2
