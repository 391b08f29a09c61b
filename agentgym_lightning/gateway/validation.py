"""What a request must be before it becomes a step: strict JSON, and a chat request that OpenAI's
own schema accepts and that our backends can render.

Everything here raises :class:`GatewayError` (a 4xx for the agent that sent it) *before*
:meth:`Episode.submit` records anything, so a bad request never reaches a batch where a backend
would reject it for every episode of the round.

- :func:`parse_json` — strict JSON (no ``NaN``/``Infinity``, no number that overflows to
  infinity, valid UTF-8, nesting at most :data:`MAX_JSON_DEPTH`, at most ``max_values`` values,
  counted before anything is parsed), parsed by pydantic-core.
- :func:`check_chat_request` — the body against the ``openai`` package's own typed request params
  (validated strictly by pydantic-core: ``"stream": "no"`` or ``"seed": "5"`` are refused, not
  coerced), then what is ours: content parts and tools our backends render. The sampling values
  (finite, in range, a seed torch and vLLM accept) are checked by
  :meth:`~agentgym_lightning.llm.ChatRequest.from_openai`.
- :func:`check_params` — the same strict check against another of the ``openai`` package's
  request types (the Responses API's, legacy Completions'), for the other wires;
  :func:`check_typed` — against any of its types (one Responses input item), the error's path
  given by the caller; :func:`check_translated_chat` — what is ours alone (no schema pass), for the
  chat request a wire translated from a request its own schema checked.

Each request gets one schema pass, its wire's: a translated request is not checked again as chat.
"""

from __future__ import annotations

import json
import math
import re
import typing
from collections.abc import Collection, Mapping
from functools import lru_cache
from typing import Annotated, Any, Union

import pydantic_core
from pydantic import Field, TypeAdapter, ValidationError
from pydantic_core import SchemaValidator

from agentgym_lightning.gateway.openai_wire import GatewayError

__all__ = [
    "MAX_JSON_DEPTH",
    "parse_json",
    "json_values_at_most",
    "check_chat_request",
    "check_translated_chat",
    "check_params",
    "check_typed",
    "check_item_counts",
    "body_too_large",
]

#: Deepest nesting of arrays and objects a body may have: pydantic-core's JSON parser refuses
#: more (a fixed limit of that parser), which also keeps every later ``deepcopy`` and ``json.dumps``
#: of the request far from Python's recursion limit.
MAX_JSON_DEPTH = 200

# Digits read as 0 and E as e, so that a number literal that may overflow a float to infinity
# (an exponent of 3+ digits, or 309+ digits) is found with a plain substring search.
_NUMBER_SHAPE = bytes.maketrans(b"123456789E", b"000000000e")
_HUGE_NUMBER = (b"0e000", b"0e+000", b"0" * 309)


def parse_json(
    body: bytes | str | Mapping[str, Any],
    what: str = "request body",
    max_bytes: int | None = None,
    max_values: int | None = None,
) -> Any:
    """Parse ``body`` as strict JSON; a mapping (an in-process caller's dict) is serialized first,
    so it obeys exactly the rules of bytes from a socket and is copied (the caller may go on
    mutating its own lists). Raises a 400 saying what is wrong, or a 413 past ``max_bytes`` or
    past ``max_values`` values (counted on the bytes, before any of them is parsed: see
    :func:`json_values_at_most`)."""
    from_mapping = isinstance(body, Mapping)
    if from_mapping:
        try:  # allow_nan=False refuses NaN and infinities here
            body = json.dumps(body, allow_nan=False).encode()
        except (TypeError, ValueError, RecursionError) as exc:
            raise GatewayError(400, f"{what} is not JSON-serializable: {_short(exc)}") from None
    raw = body.encode() if isinstance(body, str) else bytes(body)  # type: ignore[union-attr]
    if max_bytes is not None and len(raw) > max_bytes:
        raise body_too_large(max_bytes)
    if max_values is not None and not json_values_at_most(raw, max_values):
        raise GatewayError(
            413,
            f"{what} holds more than {max_values} JSON values (arrays, objects, strings, numbers); send fewer "
            "items, or raise the gateway's max_json_values (AGENTGYM_LIGHTNING_GATEWAY_MAX_JSON_VALUES)",
            code="request_too_large",
        )
    try:
        data = pydantic_core.from_json(raw or b"null", allow_inf_nan=False)
    except ValueError as exc:
        reason = str(exc)
        if "recursion limit" in reason:
            reason = f"nested deeper than {MAX_JSON_DEPTH} levels ({reason})"
        raise GatewayError(400, f"{what} is not valid JSON: {reason}") from None
    if not from_mapping:
        shape = raw.translate(_NUMBER_SHAPE)
        if any(huge in shape for huge in _HUGE_NUMBER) and _has_infinity(data):
            raise GatewayError(400, f"{what} is not valid JSON: a number overflows to infinity")
    return data


_STRING = re.compile(rb'"[^"]*"')
_SCAN_CHUNK = 64 * 2**10


def _structure(raw: bytes) -> int:
    return raw.count(b",") + raw.count(b"[") + raw.count(b"{")


def json_values_at_most(raw: bytes, limit: int) -> bool:
    """Whether the JSON text ``raw`` holds at most ``limit`` values, without parsing it: a
    document of ``n`` commas and ``c`` arrays and objects outside its strings has at most
    ``1 + n + c`` values. Counted over the whole text first (milliseconds for 8 MB); only when
    that passes ``limit`` are the strings' own commas and brackets left out, a piece at a time
    (each piece holds the GIL for a few milliseconds at most)."""
    if _structure(raw) < limit:
        return True
    # Escapes out of the way (escaped backslashes first, so ``\\\\"`` still ends its string): every quote left
    # opens or closes a string. Invalid JSON may be miscounted; it is refused by the parser anyway.
    text = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    count, start = 1, 0
    while start < len(text):
        end = min(start + _SCAN_CHUNK, len(text))
        if text.count(b'"', start, end) % 2:  # the piece would end inside a string: end after it
            close = text.find(b'"', end)
            end = len(text) if close < 0 else close + 1
        count += _structure(_STRING.sub(b"", text[start:end]))
        if count > limit:
            return False
        start = end
    return True


def _has_infinity(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and math.isinf(v):
            return True
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


# ------------------------------------------------------------------------------- the chat request


@lru_cache(maxsize=1)
def _validators() -> tuple[SchemaValidator, SchemaValidator, frozenset[str]]:
    """pydantic validators for the ``openai`` package's request params: the whole body (but its
    messages), one message (discriminated by its role), and the known roles. Built once (~0.1 s).

    The params type lists as ``Iterable[...]``, which pydantic checks only lazily, when iterated;
    JSON gives lists, so their schemas are made ``list`` schemas and everything is checked at once.
    Every list stops at its first bad item (``fail_fast``): the work and the error a bad request
    causes do not grow with how many bad items it sends.
    """
    from openai.types.chat import ChatCompletionMessageParam
    from openai.types.chat.completion_create_params import CompletionCreateParamsBase

    members = typing.get_args(ChatCompletionMessageParam)
    roles = frozenset(typing.get_args(typing.get_type_hints(m)["role"])[0] for m in members)
    message = TypeAdapter(Annotated[Union[members], Field(discriminator="role")])  # noqa: UP007 - a runtime union
    body = TypeAdapter(CompletionCreateParamsBase)
    return SchemaValidator(_eager(body.core_schema)), SchemaValidator(_eager(message.core_schema)), roles


def _eager(schema: Any) -> Any:
    """``schema`` (a pydantic-core schema) with every lazy ``generator`` schema made a ``list``,
    and every list failing fast (at its first bad item)."""
    if isinstance(schema, dict):
        out = {key: _eager(value) for key, value in schema.items()}
        if out.get("type") in ("generator", "list"):
            out["type"] = "list"
            out["fail_fast"] = True
        return out
    if isinstance(schema, list):
        return [_eager(item) for item in schema]
    return schema


def check_chat_request(body: Any, content_part_types: Collection[str] = ("text",)) -> None:
    """Refuse (400) a chat-completions body that OpenAI would refuse or our backends cannot run.

    ``content_part_types`` are the message content parts accepted (the ``hf`` and ``vllm``
    backends render ``text`` only).
    """
    _check_frame(body)
    messages = body["messages"]
    top, message, roles = _validators()
    # The messages are checked one by one below (clearer errors); "model" is optional here: we
    # serve one policy, whatever the agent calls it.
    # A top-level null is a field not given, as OpenAI's server reads it (LlamaIndex sends
    # "user": null); the typed params would refuse it for fields that are not nullable there.
    given = {k: v for k, v in body.items() if v is not None}
    _validate(top, {**given, "messages": [], "model": str(body.get("model") or "")}, ())
    for i, m in enumerate(messages):
        if type(m) is not dict or m.get("role") not in roles:
            got = m.get("role") if isinstance(m, dict) else m
            raise GatewayError(400, f"messages[{i}].role must be one of {', '.join(sorted(roles))}; got {got!r:.40}")
        _validate(message, m, ("messages", i), skip=1)  # loc[0] is the role tag
        _check_content(m.get("content"), i, content_part_types)
        for j, call in enumerate(m.get("tool_calls") or ()):
            if call.get("type") != "function":
                raise GatewayError(400, f"messages[{i}].tool_calls[{j}]: only 'function' tool calls are supported")
    for j, tool in enumerate(body.get("tools") or ()):
        if tool.get("type") != "function":
            raise GatewayError(400, f"tools[{j}]: only 'function' tools are supported, got {tool.get('type')!r:.40}")


#: The request fields whose items :func:`check_item_counts` bounds, by the limit that applies.
_ITEM_FIELDS = {"messages": "max_messages", "input": "max_messages", "tools": "max_tools"}


def check_item_counts(body: Mapping[str, Any], max_messages: int, max_tools: int, max_object_keys: int) -> None:
    """Refuse (413) a body with more than ``max_messages`` items in ``messages`` (chat,
    Anthropic) or ``input`` (Responses), more than ``max_tools`` ``tools``, or an object of more
    than ``max_object_keys`` keys among its fields and their fields (``metadata``,
    ``logit_bias``, ``prompt.variables``: maps whose every bad value is one more validation
    error, which no list's fail-fast stops): checked before anything is validated, so the work a
    request causes, and the error it gets, are bounded by these counts."""
    for key, value in body.items():
        for where, obj in ((key, value), *((f"{key}.{k}", v) for k, v in (value.items() if isinstance(value, dict) else ()))):
            if isinstance(obj, dict) and len(obj) > max_object_keys:
                raise GatewayError(
                    413,
                    f"'{where[:60]}' has {len(obj)} keys, more than this gateway's max_object_keys of {max_object_keys}; "
                    "send fewer, or raise it (AGENTGYM_LIGHTNING_GATEWAY_MAX_OBJECT_KEYS)",
                    code="request_too_large",
                )
    limits = {"max_messages": max_messages, "max_tools": max_tools}
    for key, limit_name in _ITEM_FIELDS.items():
        items = body.get(key)
        if isinstance(items, list) and len(items) > limits[limit_name]:
            raise GatewayError(
                413,
                f"'{key}' has {len(items)} items, more than this gateway's {limit_name} of {limits[limit_name]}; send "
                f"fewer, or raise it (AGENTGYM_LIGHTNING_GATEWAY_{limit_name.upper()})",
                code="request_too_large",
            )


@lru_cache(maxsize=None)
def _params_validator(params: type) -> SchemaValidator:
    return SchemaValidator(_eager(TypeAdapter(params).core_schema))


def check_params(body: dict[str, Any], params: type) -> None:
    """Refuse (400) a body that the ``openai`` package's typed request ``params`` (a TypedDict,
    e.g. the Responses API's ``ResponseCreateParamsBase``) do not accept, strictly as
    :func:`check_chat_request` checks chat bodies; the validator is built once per type."""
    _validate(_params_validator(params), {**body, "model": str(body.get("model") or "")}, ())


def check_typed(value: Any, params: Any, path: tuple[str | int, ...]) -> None:
    """Refuse (400) a ``value`` that the ``openai`` package's type ``params`` (a TypedDict or a
    union of them) does not accept, strictly as :func:`check_params`; the error names ``path``
    first (``("input[1] (function_call item)",)`` reads ``input[1] (function_call item).call_id: ...``)."""
    _validate(_params_validator(params), value, path)


def _validate(validator: SchemaValidator, value: Any, path: tuple[str | int, ...], skip: int = 0) -> None:
    try:
        validator.validate_python(value, strict=True)
    except ValidationError as exc:
        raise GatewayError(400, _describe(exc, path, skip)) from None


def _describe(exc: ValidationError, path: tuple[str | int, ...], skip: int = 0) -> str:
    """The error as ``path: message``. Of a union's alternatives, the one that got furthest into
    the input is shown (the others failed sooner); ties are joined (``a valid string or a valid
    list``). Union-member names are left out of the path."""
    found: dict[tuple[str | int, ...], list[dict[str, Any]]] = {}
    for error in exc.errors(include_url=False):
        parts = (*path, *(p for p in error["loc"][skip:] if isinstance(p, int) or _is_field(p)))
        found.setdefault(parts, []).append(error)
    parts = max(found, key=len)
    errors = found[parts]
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".")
    messages = list(dict.fromkeys(e["msg"] for e in errors))
    prefix = "Input should be "
    if len(messages) > 1 and all(m.startswith(prefix) for m in messages):
        messages = [prefix + " or ".join(m[len(prefix) :] for m in messages)]
    got = errors[0].get("input")
    shown = "" if isinstance(got, (dict, list)) or errors[0]["type"] == "missing" else f" (got {got!r:.60})"
    return f"invalid request: {where or 'body'}: {'; '.join(messages)}{shown}"


def _is_field(part: str) -> bool:
    return part[:1].islower() and part.isidentifier() and part not in _TYPE_TAGS


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}


def check_translated_chat(body: dict[str, Any], content_part_types: Collection[str]) -> None:
    """Refuse (400) a chat ``body`` that a wire translated from a request its own schema checked
    (the Responses API's) for what :func:`check_chat_request` checks beyond the schema: a
    non-empty conversation, ``stream`` true or false (the Responses API's base params do not
    type it) and content parts of the ``content_part_types`` the policy renders. The schema is
    not run again over the translation."""
    _check_frame(body)
    for i, m in enumerate(body["messages"]):
        _check_content(m.get("content"), i, content_part_types)


def _check_frame(body: Any) -> None:
    """A JSON object with a non-empty ``messages`` list and ``stream`` true or false (checked
    first, for clearer errors than the schema's)."""
    if not isinstance(body, dict):
        raise GatewayError(400, "request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise GatewayError(400, "'messages' must be a non-empty list of chat messages")
    if "stream" in body and not isinstance(body["stream"], (bool, type(None))):
        raise GatewayError(400, f"'stream' must be true or false, got {body['stream']!r:.40}")


def _check_content(content: Any, i: int, allowed: Collection[str]) -> None:
    if isinstance(content, list):
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in allowed:
                raise GatewayError(
                    400,
                    f"messages[{i}].content[{j}]: content parts of type {kind!r:.40} cannot be rendered by this "
                    f"gateway's policy (accepted: {', '.join(sorted(allowed))}); send text",
                )


def body_too_large(limit: int) -> GatewayError:
    """The 413 for a body past ``limit`` bytes (in-process, or counted while it streams in)."""
    return GatewayError(
        413,
        f"request body is larger than {limit} bytes; send less, or raise the gateway's max_body_bytes "
        "(AGENTGYM_LIGHTNING_GATEWAY_MAX_BODY_BYTES)",
        code="request_too_large",
    )


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:200]
