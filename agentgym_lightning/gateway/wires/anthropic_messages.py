"""The Anthropic Messages API wire (``POST .../v1/messages``; an Anthropic client takes the
episode's URL *without* ``/v1``: ``ctx.anthropic_base_url``).

A request is read into the chat conversation the same agent would have sent to Chat Completions:
``system`` → a leading ``system`` message; ``text`` blocks → the message's text; an assistant's
``tool_use`` blocks → its ``tool_calls``; a user's ``tool_result`` blocks → ``tool`` messages
(before the rest of its text); ``tools`` (``input_schema``) and ``tool_choice`` (``auto``, ``any``,
``tool``, ``none``) → their chat shapes; ``max_tokens``, ``stop_sequences``, ``temperature``,
``top_p``, ``metadata`` → the sampling options. Tool-call arguments go back to the policy as the
exact text it generated (the episode remembers the text behind every ``tool_use`` it answered),
so a conversation re-renders to the same tokens.

The answer is a ``message`` (``text`` and ``tool_use`` blocks, ``stop_reason`` ``end_turn`` /
``tool_use`` / ``max_tokens``, ``usage``) or, streamed, Anthropic's events from ``message_start``
to ``message_stop``; errors take Anthropic's ``{"type": "error", "error": {...}}`` shape. The key
comes as ``x-api-key`` (what the SDK sends) or as a bearer token.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

from agentgym_lightning.gateway.validation import parse_json
from agentgym_lightning.gateway.wires.base import Wire, sse, usage_counts
from agentgym_lightning.gateway.wires.chat import ChatWire
from agentgym_lightning.llm import ChatRequest, Completion, GatewayError

if TYPE_CHECKING:
    from agentgym_lightning.episode import Episode, PendingCall

__all__ = ["MessagesWire", "messages_to_chat", "content_blocks"]

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
_STOP_REASONS = {"tool_calls": "tool_use", "length": "max_tokens"}


def _arguments(episode: Episode) -> dict[str, str]:
    """tool_use id → the exact arguments text the policy generated for it."""
    return episode.wire_state.setdefault("messages.tool_arguments", {})


def _input(arguments: str) -> dict[str, Any]:
    """A tool call's arguments as a ``tool_use`` block's ``input`` object (``{}`` when the text
    is no strict JSON object: not JSON, ``NaN``, a number that overflows, nested past the strict
    parser's depth; the episode keeps the text itself). A policy's output never fails the answer."""
    try:
        value = parse_json(arguments, "tool call arguments")
    except GatewayError:
        return {}
    return value if isinstance(value, dict) else {}


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise GatewayError(400, f"{where}.content must be a string or a list of content blocks")
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise GatewayError(400, f"{where}.content[{j}] must be an object with a string 'type'")
    return content


def _block_text(content: Any, where: str) -> str:
    texts = []
    for j, block in enumerate(_blocks(content, where)):
        if block["type"] != "text":
            raise GatewayError(
                400,
                f"{where}.content[{j}]: blocks of type {block['type']!r:.40} cannot be rendered by this gateway's policy; send text",
            )
        texts.append(str(block.get("text", "")))
    return "".join(texts)


def messages_to_chat(
    system: Any, messages: list[dict[str, Any]], arguments: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """Anthropic ``system`` and ``messages`` as chat messages (see the module docstring).
    ``arguments``: the exact text behind ``tool_use`` ids (by default, ``json.dumps`` of ``input``)."""
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": system if isinstance(system, str) else _block_text(system, "system")})
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise GatewayError(400, f"{where}.role must be 'user' or 'assistant'")
        blocks = _blocks(message.get("content"), where)
        if message["role"] == "assistant":
            text, calls = [], []
            for j, block in enumerate(blocks):
                if block["type"] == "text":
                    text.append(str(block.get("text", "")))
                elif block["type"] == "tool_use":
                    if not isinstance(block.get("id"), str):
                        raise GatewayError(
                            400, f"{where}.content[{j}].id: a tool_use block needs a string id, got {block.get('id')!r:.40}"
                        )
                    known = (arguments or {}).get(block["id"])
                    raw = (
                        known
                        if known is not None and _input(known) == block.get("input")
                        else json.dumps(block.get("input", {}))
                    )
                    calls.append(
                        {
                            "id": block.get("id"),
                            "type": "function",
                            "function": {"name": block.get("name"), "arguments": raw},
                        }
                    )
                else:
                    raise GatewayError(
                        400, f"{where}.content[{j}]: assistant blocks of type {block['type']!r:.40} are not served"
                    )
            msg: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
            if calls:
                msg["tool_calls"] = calls
                msg["content"] = msg["content"] or None  # as the chat answer with no text carried it
            out.append(msg)
            continue
        text_blocks = []
        for j, block in enumerate(blocks):
            if block["type"] == "tool_result":
                content = block.get("content", "")
                result = content if isinstance(content, str) else _block_text(content, f"{where}.content[{j}]")
                out.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": result})
            else:
                text_blocks.append(block)
        if text_blocks or not blocks:
            out.append({"role": "user", "content": _block_text(text_blocks, where)})
    return out


def _tools_to_chat(tools: list[Any]) -> list[dict[str, Any]]:
    out = []
    for j, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type", "custom") != "custom" or "input_schema" not in tool:
            kind = tool.get("type") if isinstance(tool, dict) else tool
            raise GatewayError(
                400, f"tools[{j}]: only custom tools ({{name, description, input_schema}}) are served, got {kind!r:.40}"
            )
        function = {"name": tool.get("name"), "parameters": tool["input_schema"]}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice_to_chat(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind)  # type: ignore[arg-type]
    if mapped is None:
        raise GatewayError(400, f"tool_choice must be {{'type': 'auto'|'any'|'tool'|'none'}}, got {choice!r:.60}")
    return mapped


def content_blocks(completion: Completion) -> list[dict[str, Any]]:
    """The answer as Anthropic content blocks: its text (when there is text or no tool call),
    then one ``tool_use`` per tool call."""
    blocks: list[dict[str, Any]] = []
    if completion.text or not completion.tool_calls:
        blocks.append({"type": "text", "text": completion.text})
    for tc in completion.tool_calls:
        blocks.append({"type": "tool_use", "id": tc.id, "name": tc.name, "input": _input(tc.arguments)})
    return blocks


class MessagesWire(Wire):
    name = "messages"
    path = "messages"

    def parse(self, data: Any, episode: Episode, content_part_types: Collection[str]) -> ChatRequest:
        max_tokens = data.get("max_tokens")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
            raise GatewayError(400, f"max_tokens: a positive integer is required, got {max_tokens!r:.40}")
        messages = data.get("messages")
        if not isinstance(messages, list) or not messages:
            raise GatewayError(400, "messages: a non-empty list of messages is required")
        for key in ("top_k", "container", "mcp_servers"):
            if data.get(key) is not None:
                raise GatewayError(400, f"'{key}' is not served by this gateway; leave it out")
        thinking = data.get("thinking")
        if thinking is not None and (not isinstance(thinking, dict) or thinking.get("type") != "disabled"):
            raise GatewayError(
                400,
                "'thinking' is not served by this gateway (the policy writes no thinking blocks); leave it out or disable it",
            )
        chat: dict[str, Any] = {
            "model": data.get("model") or "",
            "messages": messages_to_chat(data.get("system"), messages, _arguments(episode)),
            "max_tokens": max_tokens,
        }
        if data.get("tools"):
            if not isinstance(data["tools"], list):
                raise GatewayError(400, "tools must be a list of tool definitions")
            chat["tools"] = _tools_to_chat(data["tools"])
        if data.get("tool_choice") is not None:
            chat["tool_choice"] = _tool_choice_to_chat(data["tool_choice"])
        if data.get("stop_sequences") is not None:
            chat["stop"] = data["stop_sequences"]
        for key in ("temperature", "top_p", "stream"):
            if data.get(key) is not None:
                chat[key] = data[key]
        metadata = data.get("metadata")
        if metadata is not None:
            if not isinstance(metadata, dict):
                raise GatewayError(400, "metadata must be an object")
            chat["metadata"] = {str(k): str(v) for k, v in metadata.items() if v is not None}
        if temperature := chat.get("temperature"):
            if isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature > 1:
                raise GatewayError(400, f"temperature: must be in [0, 1], got {temperature}")
        request = ChatWire().parse(chat, episode, content_part_types)
        request.wire = self.name
        return request

    def _message(self, call: PendingCall, completion: Completion | None) -> dict[str, Any]:
        p, c = usage_counts(completion) if completion is not None else (0, 0)
        body: dict[str, Any] = {
            "id": f"msg_{call.call_id}",
            "type": "message",
            "role": "assistant",
            "model": (completion.model if completion is not None else None) or call.request.model or "policy",
            "content": content_blocks(completion) if completion is not None else [],
            "stop_reason": _STOP_REASONS.get(completion.finish_reason, "end_turn") if completion is not None else None,
            "stop_sequence": None,
            "usage": {"input_tokens": p, "output_tokens": c, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
        }
        if completion is not None and completion.prompt_token_ids is not None:
            body["prompt_token_ids"] = completion.prompt_token_ids
        if completion is not None and completion.completion_token_ids is not None:
            body["token_ids"] = completion.completion_token_ids
        return body

    def _remember(self, call: PendingCall, completion: Completion) -> None:
        _arguments(call.episode).update({tc.id: tc.arguments for tc in completion.tool_calls})

    def body(self, call: PendingCall, completion: Completion) -> dict[str, Any]:
        self._remember(call, completion)
        return self._message(call, completion)

    def events(self, call: PendingCall, completion: Completion) -> list[bytes]:
        self._remember(call, completion)
        final = self._message(call, completion)
        start = {**self._message(call, None), "usage": {**final["usage"], "output_tokens": 0}}
        out: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
        texts = len(final["content"]) - len(completion.tool_calls)
        for index, block in enumerate(final["content"]):
            if block["type"] == "text":
                out.append({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}})
                if block["text"]:
                    out.append(
                        {
                            "type": "content_block_delta",
                            "index": index,
                            "delta": {"type": "text_delta", "text": block["text"]},
                        }
                    )
            else:
                raw = completion.tool_calls[index - texts].arguments
                # The exact text when it is the object sent as ``input``; the client parses it back.
                partial = raw if block["input"] and _input(raw) == block["input"] else json.dumps(block["input"])
                out.append({"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}})
                out.append(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": partial},
                    }
                )
            out.append({"type": "content_block_stop", "index": index})
        delta = {"stop_reason": final["stop_reason"], "stop_sequence": None}
        out.append({"type": "message_delta", "delta": delta, "usage": {"output_tokens": final["usage"]["output_tokens"]}})
        out.append({"type": "message_stop"})
        return [sse(event["type"], event) for event in out]

    def error_body(self, exc: GatewayError) -> dict[str, Any]:
        kind = _ERROR_TYPES.get(exc.status, "api_error" if exc.status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": exc.message}}

    def credentials(self, headers: Mapping[str, str]) -> str | None:
        key = headers.get("x-api-key")
        return headers.get("authorization") or (f"Bearer {key}" if key else None)
