"""Parsing the model's ``<tool_call>`` text format, and writing it back."""

from __future__ import annotations

import itertools
import json

import pytest

from agentgym_lightning.llm import ToolCall
from agentgym_lightning.policies.tool_calls import (
    format_tool_call,
    new_tool_call_id,
    parse_tool_calls,
    render_assistant_text,
    render_tool_result,
    render_tools_system_prompt,
)


def _ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def test_single_call_with_content():
    text = 'Let me look.\n<tool_call>{"name": "run_sql", "arguments": {"query": "SELECT 1"}}</tool_call>'
    parsed = parse_tool_calls(text, make_id=_ids())
    assert parsed.content == "Let me look."
    assert parsed.errors == []
    assert parsed.tool_calls == [ToolCall(id="call_0", name="run_sql", arguments='{"query": "SELECT 1"}')]


def test_several_calls_multiline_and_text_between():
    text = (
        "<tool_call>\n"
        '{"name": "a", "arguments": {"x": 1}}\n'
        "</tool_call> and then <tool_call>"
        '{"name": "b", "arguments": {"y": [1, 2], "z": "é"}}</tool_call>'
    )
    parsed = parse_tool_calls(text)
    assert [c.name for c in parsed.tool_calls] == ["a", "b"]
    assert json.loads(parsed.tool_calls[0].arguments) == {"x": 1}
    assert json.loads(parsed.tool_calls[1].arguments) == {"y": [1, 2], "z": "é"}
    assert parsed.content == "and then"
    assert parsed.errors == []


def test_call_ids_are_openai_style_and_unique():
    parsed = parse_tool_calls('<tool_call>{"name": "a"}</tool_call><tool_call>{"name": "a"}</tool_call>')
    ids = [c.id for c in parsed.tool_calls]
    assert all(i.startswith("call_") and len(i) == 29 for i in ids)
    int(ids[0][5:], 16)  # hex digits
    assert len(set(ids)) == 2
    assert new_tool_call_id() != new_tool_call_id()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('{"name": "f"}', {}),  # missing arguments means none
        ('{"name": "f", "arguments": null}', {}),
        ('{"name": "f", "arguments": "{\\"a\\": 1}"}', {"a": 1}),  # double-encoded string
        ('{"name": "f", "parameters": {"a": 2}}', {"a": 2}),  # Llama-style synonym
    ],
)
def test_argument_variants(body, expected):
    parsed = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert parsed.errors == []
    assert json.loads(parsed.tool_calls[0].arguments) == expected


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ('{"name": "f", "arguments": {"a": 1}', "not valid JSON"),  # truncated JSON
        ("not json at all", "not valid JSON"),
        ('{"arguments": {"a": 1}}', "no string 'name'"),
        ('{"name": "", "arguments": {}}', "no string 'name'"),
        ('{"name": 3}', "no string 'name'"),
        ('["f", {}]', "must be a JSON object"),
        ('{"name": "f", "arguments": [1, 2]}', "must be a JSON object"),
        ('{"name": "f", "arguments": "{oops"}', "not valid JSON"),
        ("   ", "empty"),
    ],
)
def test_malformed_call_stays_in_content_with_an_error(body, fragment):
    text = f"Before <tool_call>{body}</tool_call> after"
    parsed = parse_tool_calls(text)
    assert parsed.tool_calls == []
    assert len(parsed.errors) == 1 and fragment in parsed.errors[0]
    assert parsed.content == text.strip()  # verbatim: the agent sees what the model wrote


def test_good_and_bad_calls_mixed():
    text = '<tool_call>{"name": "ok", "arguments": {}}</tool_call>\n<tool_call>{"name": oops}</tool_call>'
    parsed = parse_tool_calls(text)
    assert [c.name for c in parsed.tool_calls] == ["ok"]
    assert len(parsed.errors) == 1
    assert parsed.content == '<tool_call>{"name": oops}</tool_call>'


def test_unterminated_call_is_an_error_not_a_call():
    text = 'Sure <tool_call>{"name": "f", "arguments": {"a": 1}}'
    parsed = parse_tool_calls(text)
    assert parsed.tool_calls == []
    assert parsed.errors and "unterminated" in parsed.errors[0]
    assert parsed.content == text


def test_plain_text_is_untouched():
    parsed = parse_tool_calls("  just an answer\n")
    assert parsed.tool_calls == [] and parsed.errors == []
    assert parsed.content == "just an answer"


def test_non_string_input_is_a_type_error():
    with pytest.raises(TypeError):
        parse_tool_calls(None)  # type: ignore[arg-type]


def test_format_and_render_round_trip():
    calls = [
        ToolCall(id="call_1", name="run_sql", arguments='{"query": "SELECT * FROM t"}'),
        {"id": "call_2", "type": "function", "function": {"name": "finish", "arguments": {"answer": 42}}},
    ]
    text = render_assistant_text("Thinking.", calls)
    assert text == (
        "Thinking.\n"
        '<tool_call>{"name": "run_sql", "arguments": {"query": "SELECT * FROM t"}}</tool_call>\n'
        '<tool_call>{"name": "finish", "arguments": {"answer": 42}}</tool_call>'
    )
    parsed = parse_tool_calls(text)
    assert parsed.content == "Thinking."
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [
        ("run_sql", {"query": "SELECT * FROM t"}),
        ("finish", {"answer": 42}),
    ]
    # and the canonical layout is a fixed point
    assert render_assistant_text(parsed.content, parsed.tool_calls) == text


def test_format_tool_call_keeps_bad_argument_strings():
    assert format_tool_call("f", "{bad") == '<tool_call>{"name": "f", "arguments": "{bad"}</tool_call>'
    assert format_tool_call("f", "") == '<tool_call>{"name": "f", "arguments": {}}</tool_call>'


def test_tools_system_prompt_lists_every_tool_and_the_format():
    tools = [
        {"type": "function", "function": {"name": "run_sql", "description": "Run SQL", "parameters": {"type": "object"}}},
        {"name": "finish", "parameters": {"type": "object"}},  # bare function spec
    ]
    prompt = render_tools_system_prompt(tools, system="You are a SQL agent.")
    assert prompt.startswith("You are a SQL agent.\n\n# Tools")
    assert '"name": "run_sql"' in prompt and '"name": "finish"' in prompt
    assert "<tool_call>" in prompt and "</tool_call>" in prompt
    assert render_tools_system_prompt(tools).startswith("# Tools")


def test_tool_result_block():
    assert render_tool_result("3 rows") == "<tool_response>\n3 rows\n</tool_response>"


def test_compact_tools_prompt_is_one_sentence_per_tool():
    tools = [
        {"type": "function", "function": {"name": "calculator", "description": "Compute.",
                                          "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}},
        {"name": "search", "parameters": {"type": "object", "properties": {"query": {}, "k": {}}}},
        {"name": "now"},
    ]
    assert render_tools_system_prompt(tools, system="Be brief.", style="compact").splitlines() == [
        "Be brief.",
        'To use the calculator, write <tool_call>{"name": "calculator", "arguments": {"expression": "..."}}</tool_call> '
        "and its result comes back in <tool_response></tool_response>.",
        'To use the search, write <tool_call>{"name": "search", "arguments": {"query": "...", "k": "..."}}</tool_call> '
        "and its result comes back in <tool_response></tool_response>.",
        'To use the now, write <tool_call>{"name": "now", "arguments": {}}</tool_call> '
        "and its result comes back in <tool_response></tool_response>.",
    ]
    with pytest.raises(ValueError, match="full, compact"):
        render_tools_system_prompt(tools, style="short")


def test_tool_call_arguments_that_are_not_strict_json_are_reported_never_raised():
    """A policy's own output: NaN, Infinity, 1e999 and nesting past the JSON decoder's recursion
    limit are malformed calls (kept as text, reported), never non-JSON for the agent nor a raise."""
    deep = "[" * 100_000 + "]" * 100_000
    for args in ("NaN", '{"a": NaN}', '{"a": Infinity}', '{"a": 1e999}', '{"a": ' + deep + "}", json.dumps('{"a": NaN}')):
        text = f'<tool_call>{{"name": "f", "arguments": {args}}}</tool_call>'
        parsed = parse_tool_calls(text)
        assert parsed.tool_calls == [] and len(parsed.errors) == 1, args[:40]
        assert "not valid JSON" in parsed.errors[0] or "nested too deep" in parsed.errors[0]
    assert parse_tool_calls('<tool_call>{"name": "f", "arguments": {"a": 1.5e300}}</tool_call>').tool_calls
