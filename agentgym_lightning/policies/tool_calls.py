"""Tool calls in the model's own text format, both ways.

Small open models (SmolLM2, Qwen2.5, Hermes-style fine-tunes) call tools by writing::

    <tool_call>{"name": "run_sql", "arguments": {"query": "SELECT 1"}}</tool_call>

anywhere in their answer, possibly several times. :func:`parse_tool_calls` turns such text into
OpenAI :class:`~agentgym_lightning.llm.ToolCall` objects; :func:`format_tool_call` /
:func:`render_assistant_text` write them back (to re-render history for chat templates without
tool support); :func:`render_tools_system_prompt` describes the tools in a system prompt for the
same templates.

A block that is not a valid call (bad JSON, no name) is *not* an exception: it stays in the
content and one message is recorded in :attr:`ParsedToolCalls.errors`, which AIR plugins may
turn into a penalty.

These names are stable API used by every tokenizing backend (``hf``, ``vllm``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentgym_lightning.llm import ToolCall, new_tool_call_id

__all__ = [
    "TOOL_CALL_OPEN",
    "TOOL_CALL_CLOSE",
    "ParsedToolCalls",
    "new_tool_call_id",
    "parse_tool_calls",
    "format_tool_call",
    "render_assistant_text",
    "render_tools_system_prompt",
    "render_tool_result",
    "TOOL_PROMPTS",
    "check_tool_prompt",
]

#: How :func:`render_tools_system_prompt` describes tools: ``"full"`` (Qwen2.5's wording: the JSON
#: schemas and the format) or ``"compact"`` (one sentence per tool: the call to write and where its
#: result comes back). SmolLM2-135M follows the compact one and not the full one (greedy,
#: Arithmetic level 4 with three worked examples: 14/16 vs 0/16; envs/math/README.md).
TOOL_PROMPTS: tuple[str, ...] = ("full", "compact")


def check_tool_prompt(style: str) -> str:
    """``style`` when it is one of :data:`TOOL_PROMPTS`, else :class:`ValueError` naming them."""
    if style not in TOOL_PROMPTS:
        raise ValueError(f"tool_prompt must be one of {', '.join(TOOL_PROMPTS)}; got {style!r}")
    return style

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

# Non-greedy, DOTALL: several calls in one answer, each possibly spanning lines.
_BLOCK_RE = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)


@dataclass
class ParsedToolCalls:
    """What :func:`parse_tool_calls` found in a model's answer."""

    #: The text outside the valid calls, stripped (malformed blocks stay in it verbatim).
    content: str
    #: The valid calls, in order; ``arguments`` is a JSON object serialized to a string.
    tool_calls: list[ToolCall] = field(default_factory=list)
    #: One human-readable message per malformed call (an AIR signal), in order.
    errors: list[str] = field(default_factory=list)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text[:40]} overflows to infinity")
    return value


def _strict_loads(text: str) -> Any:
    """``text`` as strict JSON: ``NaN``, ``Infinity`` and numbers that overflow to infinity are
    refused (an agent must receive JSON), as is nesting past the decoder's recursion limit
    (``ValueError`` for all of them)."""
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite)
    except RecursionError:
        raise ValueError("nested too deep") from None


def _parse_block(body: str) -> tuple[str, str] | str:
    """``(name, arguments_json)`` for a valid call body, else an error message."""
    body = body.strip()
    if not body:
        return "empty <tool_call> block"
    try:
        obj = _strict_loads(body)
    except json.JSONDecodeError as exc:
        return f"tool call is not valid JSON ({exc.msg} at char {exc.pos}): {body[:200]!r}"
    except ValueError as exc:
        return f"tool call is not valid JSON ({exc}): {body[:200]!r}"
    if not isinstance(obj, dict):
        return f"tool call must be a JSON object with 'name' and 'arguments', got {type(obj).__name__}"
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return f"tool call has no string 'name': {body[:200]!r}"
    # "parameters" is what Llama-3-style prompts ask for; accept it as a synonym.
    args: Any = obj.get("arguments", obj.get("parameters", {}))
    if args is None:
        args = {}
    if isinstance(args, str):
        # Some models double-encode the arguments as a JSON string, OpenAI-wire style.
        try:
            args = _strict_loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            return f"tool call {name!r} has arguments that are not valid JSON ({exc.msg})"
        except ValueError as exc:
            return f"tool call {name!r} has arguments that are not valid JSON ({exc})"
    if not isinstance(args, dict):
        return f"tool call {name!r} arguments must be a JSON object, got {type(args).__name__}"
    try:
        return name.strip(), json.dumps(args, ensure_ascii=False)
    except RecursionError:
        return f"tool call {name!r} has arguments nested too deep"


def parse_tool_calls(text: str, *, make_id: Callable[[], str] | None = None) -> ParsedToolCalls:
    """Split a model answer into content and ``<tool_call>{...}</tool_call>`` calls.

    Each block must hold a JSON object with a string ``name`` and an object ``arguments``
    (``parameters`` is accepted as a synonym; a JSON string holding an object is decoded; a
    missing one means ``{}``). A block that fails any of this is left in ``content`` verbatim and
    reported in ``errors``; so is an unterminated ``<tool_call>`` (a model cut off mid-call).
    Never raises on model output.

    ``make_id`` supplies call ids (default :func:`new_tool_call_id`); pass a deterministic one
    in tests.
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_tool_calls expects the model's text as a str, not {type(text).__name__}")
    make_id = make_id or new_tool_call_id
    calls: list[ToolCall] = []
    errors: list[str] = []
    kept: list[str] = []
    pos = 0
    for match in _BLOCK_RE.finditer(text):
        kept.append(text[pos : match.start()])
        parsed = _parse_block(match.group(1))
        if isinstance(parsed, str):
            errors.append(parsed)
            kept.append(match.group(0))  # malformed: the agent still sees what the model wrote
        else:
            calls.append(ToolCall(id=make_id(), name=parsed[0], arguments=parsed[1]))
        pos = match.end()
    rest = text[pos:]
    if TOOL_CALL_OPEN in rest:
        errors.append("unterminated <tool_call> block (no closing </tool_call>)")
    kept.append(rest)
    return ParsedToolCalls(content="".join(kept).strip(), tool_calls=calls, errors=errors)


def _arguments_object(arguments: Any) -> Any:
    """The arguments as a JSON value (a call's ``arguments`` is JSON text on the wire)."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except (json.JSONDecodeError, RecursionError):
            return arguments  # keep what the agent sent; the model will see it as a string
    return {} if arguments is None else arguments


def format_tool_call(name: str, arguments: Any) -> str:
    """One call as the model writes it: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

    ``arguments`` may be a JSON string (OpenAI wire format) or a mapping. The JSON uses
    ``json.dumps`` defaults so that the rendering is the same as what the tools prompt shows.
    """
    payload = {"name": name, "arguments": _arguments_object(arguments)}
    return TOOL_CALL_OPEN + json.dumps(payload, ensure_ascii=False) + TOOL_CALL_CLOSE


def _call_name_args(call: ToolCall | Mapping[str, Any]) -> tuple[str, Any]:
    if isinstance(call, ToolCall):
        return call.name, call.arguments
    fn = call.get("function") or call  # OpenAI {"function": {...}} or a bare {"name", "arguments"}
    return str(fn.get("name") or ""), fn.get("arguments", {})


def render_assistant_text(content: str | None, tool_calls: Sequence[ToolCall | Mapping[str, Any]] | None) -> str:
    """An assistant message with tool calls as the model would have written it.

    ``content`` first, then one :func:`format_tool_call` per call, separated by newlines. This
    is the inverse of :func:`parse_tool_calls` for text the model wrote in this layout, which is
    what keeps a re-rendered conversation token-exact (checked by :func:`agentgym_lightning.llm.ids_extend`).
    """
    parts = [content] if content else []
    for call in tool_calls or []:
        parts.append(format_tool_call(*_call_name_args(call)))
    return "\n".join(parts)


def render_tool_result(content: str, name: str | None = None) -> str:
    """A tool's result as a ``<tool_response>`` block (Qwen style), for templates with no ``tool`` role."""
    del name  # the call order identifies the result, as in Qwen's own template
    return f"<tool_response>\n{content}\n</tool_response>"


def _tool_function(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    # OpenAI tools are {"type": "function", "function": {...}}; accept bare function specs too.
    return tool.get("function", tool) if isinstance(tool, Mapping) else {}


def render_tools_system_prompt(tools: Sequence[Mapping[str, Any]], system: str | None = None, style: str = "full") -> str:
    """A system prompt that describes ``tools`` and the ``<tool_call>`` format.

    For chat templates that take no ``tools`` argument. ``system`` (the conversation's own system
    message, if any) comes first. ``style`` is one of :data:`TOOL_PROMPTS`: ``"full"`` (Qwen2.5's
    wording, the schemas included) or ``"compact"``::

        To use the calculator, write <tool_call>{"name": "calculator", "arguments": {"expression": "..."}}</tool_call> and its result comes back in <tool_response></tool_response>.
    """
    if check_tool_prompt(style) == "compact":
        prompt = "\n".join(_compact_tool_line(_tool_function(t)) for t in tools)
        return f"{system}\n{prompt}" if system else prompt
    specs = [json.dumps(dict(_tool_function(t)), ensure_ascii=False) for t in tools]
    lines = [
        "# Tools",
        "",
        "You may call one or more functions to assist with the user query.",
        "",
        "You are provided with function signatures within <tools></tools> XML tags:",
        "<tools>",
        *specs,
        "</tools>",
        "",
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:",
        '<tool_call>{"name": <function-name>, "arguments": <args-json-object>}</tool_call>',
    ]
    prompt = "\n".join(lines)
    return f"{system}\n\n{prompt}" if system else prompt


def _compact_tool_line(function: Mapping[str, Any]) -> str:
    name = str(function.get("name", ""))
    properties = (function.get("parameters") or {}).get("properties") or {}
    arguments = ", ".join(f"{json.dumps(str(p))}: \"...\"" for p in properties)
    call = f'{TOOL_CALL_OPEN}{{"name": {json.dumps(name)}, "arguments": {{{arguments}}}}}{TOOL_CALL_CLOSE}'
    # The wording of the math env's text protocol, whose prompt SmolLM2-135M was measured to follow.
    return f"To use the {name}, write {call} and its result comes back in <tool_response></tool_response>."
