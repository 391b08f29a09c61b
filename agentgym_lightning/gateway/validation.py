"""What a request must be before it becomes a step: strict JSON, and a chat request that OpenAI's
own schema accepts and that our backends can render.

Everything here raises :class:`GatewayError` (a 4xx for the agent that sent it) *before*
:meth:`Episode.submit` records anything, so a bad request never reaches a batch where a backend
would reject it for every episode of the round.

- :func:`parse_json` — strict JSON (no ``NaN``/``Infinity``, no number that overflows to
  infinity, valid UTF-8, nesting at most :data:`MAX_JSON_DEPTH`), parsed by pydantic-core.
- :func:`check_chat_request` — the body against the ``openai`` package's own typed request params
  (validated strictly by pydantic: ``"stream": "no"`` or ``"seed": "5"`` are refused, not
  coerced), then what is ours: content parts and tools our backends render. The sampling values
  (finite, in range, a seed torch and vLLM accept) are checked by
  :meth:`~agentgym_lightning.llm.ChatRequest.from_openai`.
"""

from __future__ import annotations

import json
import math
import re
import typing
from collections.abc import Collection, Iterator, Mapping
from functools import lru_cache
from typing import Annotated, Any, Union

import pydantic_core
from pydantic import Field, TypeAdapter, ValidationError

from agentgym_lightning.gateway.openai_wire import GatewayError

__all__ = ["MAX_JSON_DEPTH", "parse_json", "check_chat_request", "body_too_large"]

#: Deepest nesting of arrays and objects a body may have: pydantic-core's JSON parser refuses
#: more (a fixed limit of that parser), which also keeps every later ``deepcopy`` and ``json.dumps``
#: of the request far from Python's recursion limit.
MAX_JSON_DEPTH = 200

# A number literal that may overflow a float to infinity: an exponent of 3+ digits, or 309+ digits.
_HUGE_NUMBER = re.compile(rb"\d[eE]\+?\d{3}|\d{309}")


def parse_json(body: bytes | str | Mapping[str, Any], what: str = "request body", max_bytes: int | None = None) -> Any:
    """Parse ``body`` as strict JSON; a mapping (an in-process caller's dict) is serialized first,
    so it obeys exactly the rules of bytes from a socket and is copied (the caller may go on
    mutating its own lists). Raises a 400 saying what is wrong, or a 413 past ``max_bytes``."""
    if isinstance(body, Mapping):
        try:
            body = json.dumps(body, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            raise GatewayError(400, f"{what} is not JSON-serializable: {_short(exc)}") from None
    if max_bytes is not None and len(body) > max_bytes:
        raise body_too_large(max_bytes)
    try:
        data = pydantic_core.from_json(body or b"null", allow_inf_nan=False)
    except ValueError as exc:
        reason = str(exc)
        if "recursion limit" in reason:
            reason = f"nested deeper than {MAX_JSON_DEPTH} levels ({reason})"
        raise GatewayError(400, f"{what} is not valid JSON: {reason}") from None
    raw = body.encode() if isinstance(body, str) else body
    if _HUGE_NUMBER.search(raw) and _has_infinity(data):
        raise GatewayError(400, f"{what} is not valid JSON: a number overflows to infinity")
    return data


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
def _adapters() -> tuple[TypeAdapter[Any], TypeAdapter[Any], frozenset[str]]:
    """pydantic adapters for the ``openai`` package's request params (built once: ~0.1 s)."""
    from openai.types.chat import ChatCompletionMessageParam
    from openai.types.chat.completion_create_params import CompletionCreateParamsBase

    members = typing.get_args(ChatCompletionMessageParam)
    roles = frozenset(typing.get_args(typing.get_type_hints(m)["role"])[0] for m in members)
    message = TypeAdapter(Annotated[Union[members], Field(discriminator="role")])  # noqa: UP007 - a runtime union
    return TypeAdapter(CompletionCreateParamsBase), message, roles


def check_chat_request(body: Any, content_part_types: Collection[str] = ("text",)) -> None:
    """Refuse (400) a chat-completions body that OpenAI would refuse or our backends cannot run.

    ``content_part_types`` are the message content parts accepted (the ``hf`` and ``vllm``
    backends render ``text`` only).
    """
    if not isinstance(body, dict):
        raise GatewayError(400, "request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise GatewayError(400, "'messages' must be a non-empty list of chat messages")
    if "stream" in body and not isinstance(body["stream"], (bool, type(None))):
        raise GatewayError(400, f"'stream' must be true or false, got {body['stream']!r:.40}")
    for key in ("tools", "functions"):
        _must_be_list(body.get(key), key)
    top, message, roles = _adapters()
    # The messages are checked one by one below (clearer errors); "model" is optional here: we
    # serve one policy, whatever the agent calls it.
    _validate(top, {**body, "messages": [], "model": str(body.get("model") or "")}, "")
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in roles:
            got = m.get("role") if isinstance(m, dict) else m
            raise GatewayError(400, f"{where}.role must be one of {', '.join(sorted(roles))}; got {got!r:.40}")
        if not isinstance(m.get("content"), str):
            _must_be_list(m.get("content"), f"{where}.content", "a string or a list of content parts")
        _must_be_list(m.get("tool_calls"), f"{where}.tool_calls")
        _validate(message, m, where, skip=1)  # loc[0] is the role tag
        _check_content(m.get("content"), where, content_part_types)
        for j, call in enumerate(m.get("tool_calls") or []):
            if call.get("type") != "function":
                raise GatewayError(400, f"{where}.tool_calls[{j}]: only 'function' tool calls are supported")
    for j, tool in enumerate(body.get("tools") or []):
        if tool.get("type") != "function":
            raise GatewayError(400, f"tools[{j}]: only 'function' tools are supported, got {tool.get('type')!r:.40}")


def _must_be_list(value: Any, where: str, what: str = "a list") -> None:
    # pydantic takes any iterable for the params' Iterable[...] fields: a string or an object too.
    if value is not None and not isinstance(value, list):
        raise GatewayError(400, f"invalid request: {where}: must be {what}, got {type(value).__name__} {value!r:.40}")


def _validate(adapter: TypeAdapter[Any], value: Any, where: str, skip: int = 0) -> None:
    """Strict validation, including the ``Iterable[...]`` fields that pydantic checks lazily."""
    try:
        _drain(adapter.validate_python(value, strict=True), where)
    except ValidationError as exc:
        raise GatewayError(400, _describe(exc, where, skip)) from None


def _drain(value: Any, where: str) -> None:
    # pydantic validates Iterable[...] fields (messages' content parts, tool_calls, tools...) only
    # when iterated: iterate every one, so a bad item is found now, with its path.
    if isinstance(value, dict):
        for key, item in value.items():
            _drain(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, Iterator):
        i = 0
        try:
            for i, item in enumerate(value):  # noqa: B007 - i names the failing item
                _drain(item, f"{where}[{i}]")
        except ValidationError as exc:
            raise GatewayError(400, _describe(exc, f"{where}[{i}]", skip=1)) from None


def _describe(exc: ValidationError, where: str, skip: int = 0) -> str:
    """The first error as ``path: message``; union-member names are left out of the path."""
    error = exc.errors(include_url=False)[0]
    path = where
    for part in error["loc"][skip:]:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part[:1].islower() and part.isidentifier() and part not in _TYPE_TAGS:
            path += f".{part}" if path else part
    got = error.get("input")
    shown = "" if isinstance(got, (dict, list)) or error["type"] == "missing" else f" (got {got!r:.60})"
    return f"invalid request: {path or 'body'}: {error['msg']}{shown}"


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}


def _check_content(content: Any, where: str, allowed: Collection[str]) -> None:
    if isinstance(content, list):
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in allowed:
                raise GatewayError(
                    400,
                    f"{where}.content[{j}]: content parts of type {kind!r:.40} cannot be rendered by this "
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
