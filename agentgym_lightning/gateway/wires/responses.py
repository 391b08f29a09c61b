"""The OpenAI Responses API wire (``POST .../v1/responses``).

A request is read into the chat conversation the same agent would have sent to Chat Completions
(so the policy sees the same observation whichever API the agent used):

- ``instructions`` → a leading ``system`` message (not carried over by ``previous_response_id``,
  as OpenAI documents);
- ``input``: a string → one ``user`` message; message items → messages (text parts joined);
  ``function_call`` items → the ``tool_calls`` of one ``assistant`` message (with the text of the
  assistant message just before them, as the chat answer carried both); ``function_call_output``
  → ``tool`` messages;
- ``previous_response_id`` → that response's conversation (its input and its output) first: the
  gateway keeps every response of the episode (``Episode.wire_state``), and only those;
- function ``tools`` and ``tool_choice`` → their chat shapes; ``max_output_tokens`` →
  ``max_tokens``; ``temperature``, ``top_p``, ``metadata``, ``parallel_tool_calls`` as they are;
  ``text.format`` → ``response_format``; ``include: ["message.output_text.logprobs"]`` →
  ``logprobs``.

What OpenAI's own API accepts is accepted: ``null`` for an optional field (the SDK sends an
argument given as ``None``, e.g. LlamaIndex's ``user=None``), and output items sent back as input
as ``item.model_dump()`` makes them (a null for every field the SDK did not set, ``namespace``,
``caller``...; fields we do not read are ignored). Each input item is checked against the
``openai`` package's types of its own kind, so an error names the item's type and its field
(``input[1] (function_call item).call_id: ...``).

The answer is a ``response`` object (a ``message`` item with ``output_text``, one
``function_call`` item per tool call, ``usage``) or, streamed, Responses events from
``response.created`` to ``response.completed``. Token ids ride along as in chat:
``prompt_token_ids`` and ``token_ids`` on the response object.
"""

from __future__ import annotations

import time
import typing
from collections.abc import Collection
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Union

from openai.types.responses import ResponseInputItemParam
from openai.types.responses.response_create_params import ResponseCreateParamsBase

from agentgym_lightning.gateway.openai_wire import assistant_message
from agentgym_lightning.gateway.validation import check_params, check_translated_chat, check_typed
from agentgym_lightning.gateway.wires.base import Wire, sse, usage_counts
from agentgym_lightning.llm import ChatRequest, Completion, GatewayError

if TYPE_CHECKING:
    from agentgym_lightning.episode import Episode, PendingCall

__all__ = [
    "ResponsesWire",
    "input_to_messages",
    "tools_to_chat",
    "tools_from_chat",
    "tool_choice_to_chat",
    "output_items",
]

#: Request fields that ask for what only OpenAI's servers do: refused with a 400 naming them.
_UNSERVED = {
    "background": "background responses",
    "conversation": "stored conversations (send previous_response_id or the whole input)",
    "prompt": "prompt templates",
    "context_management": "context management",
}
_LOGPROBS = "message.output_text.logprobs"
#: The input items this wire reads (:func:`input_to_messages`).
_SERVED_ITEMS = ("message", "function_call", "function_call_output")


@dataclass
class _Stored:
    """One response of the episode: the conversation it continued and its answer, once answered."""

    conversation: list[dict[str, Any]]
    answered: bool = False


def _stored(episode: Episode) -> dict[str, _Stored]:
    """The episode's responses by id (only its own: an id never reaches another episode)."""
    return episode.wire_state.setdefault("responses", {})


def response_id(call: PendingCall) -> str:
    return f"resp_{call.call_id}"


# --------------------------------------------------------------------------- requests


def _text(content: Any, where: str, assistant: bool) -> Any:
    """A message item's content as chat content: a string as it is; text parts joined (an
    assistant's, always: chat answers are one string) or as chat text parts."""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content or ()):
        kind = part.get("type")
        if kind not in ("input_text", "output_text"):
            raise GatewayError(
                400,
                f"{where}.content[{j}]: content of type {kind!r:.40} cannot be rendered by this gateway's policy; send text",
            )
        texts.append(part.get("text", ""))
    if assistant or len(texts) == 1:
        return "".join(texts)
    return [{"type": "text", "text": t} for t in texts]


def _nulls_absent(data: dict[str, Any]) -> dict[str, Any]:
    """The body with a ``null`` read as a field not given, as OpenAI's server reads it, at the
    body's top level, in each input item and in each item's content (or output) parts. No field
    there is both required and nullable in the ``openai`` types, so nothing that means ``null``
    is lost; tools are left as they are (a function tool's ``parameters`` and ``strict`` may be
    ``null``), and so is all free-form JSON (a schema's ``"default": null``)."""
    body = _without_nulls(data)
    if isinstance(body.get("input"), list):
        body["input"] = [_item_without_nulls(item) for item in body["input"]]
    return body


def _without_nulls(obj: Any) -> Any:
    return {k: v for k, v in obj.items() if v is not None} if isinstance(obj, dict) else obj


def _item_without_nulls(item: Any) -> Any:
    item = _without_nulls(item)
    if isinstance(item, dict):
        for key in ("content", "output"):
            if isinstance(item.get(key), list):
                item[key] = [_without_nulls(part) for part in item[key]]
    return item


@lru_cache(maxsize=None)
def _item_params(kind: str) -> Any:
    """The ``openai`` package's input-item types of ``kind`` (a union for ``message``, which comes
    in three shapes: an easy message, an input message, an output message sent back)."""
    members = tuple(
        m for m in typing.get_args(ResponseInputItemParam) if kind in typing.get_args(typing.get_type_hints(m).get("type"))
    )
    return Union[members]  # noqa: UP007 - a runtime union


def _unserved_item(where: str, kind: Any) -> GatewayError:
    return GatewayError(
        400,
        f"{where}: items of type {kind!r:.40} are not served; this gateway reads {', '.join(_SERVED_ITEMS)} items",
    )


def _check_items(items: list[Any]) -> None:
    """Refuse (400) an input item that is not served or that the ``openai`` types of its kind do
    not accept; the error names the item, its type and its field."""
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise GatewayError(400, f"input[{i}] must be an input item (an object), got {type(item).__name__}")
        kind = item.get("type", "message")
        if kind not in _SERVED_ITEMS:
            raise _unserved_item(f"input[{i}]", kind)
        check_typed(item, _item_params(kind), (f"input[{i}] ({kind} item)",))


def input_to_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses ``input`` as chat messages (see the module docstring)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            messages.append({"role": role, "content": _text(item.get("content"), where, role == "assistant")})
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                if not last["content"]:
                    last["content"] = None  # as the chat answer with no text carried it
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            content = output if isinstance(output, str) else _text(output, where, True)
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": content})
        else:
            raise _unserved_item(where, kind)
    return messages


def tools_to_chat(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses function tools (``{"type", "name", "parameters", ...}``) in the chat shape."""
    out = []
    for j, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise GatewayError(400, f"tools[{j}]: only 'function' tools are served, got {tool.get('type')!r:.40}")
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        out.append({"type": "function", "function": function})
    return out


def tools_from_chat(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The inverse of :func:`tools_to_chat` (the response object repeats the tools)."""
    return [{"type": "function", **tool["function"]} for tool in tools or ()]


def tool_choice_to_chat(choice: Any) -> Any:
    """``"auto"``/``"none"``/``"required"`` as they are; ``{"type": "function", "name"}`` in the chat shape."""
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise GatewayError(400, f"tool_choice: only 'function' choices are served, got {choice.get('type')!r:.40}")
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def _tool_choice_from_chat(choice: Any) -> Any:
    if isinstance(choice, dict):
        return {"type": "function", "name": choice["function"]["name"]}
    return choice if choice is not None else "auto"


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format") or {"type": "text"}
    if fmt["type"] == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if fmt.get(k) is not None}
        return {"type": "json_schema", "json_schema": schema}
    return {"type": "json_object"} if fmt["type"] == "json_object" else None


# --------------------------------------------------------------------------- answers


def output_items(call: PendingCall, completion: Completion) -> list[dict[str, Any]]:
    """The answer as Responses output items: the text as one ``message`` (when there is text or
    no tool call) and one ``function_call`` per tool call."""
    items: list[dict[str, Any]] = []
    if completion.text or not completion.tool_calls:
        part: dict[str, Any] = {"type": "output_text", "text": completion.text, "annotations": []}
        if call.request.sampling.logprobs and completion.logprobs is not None:
            ids = completion.completion_token_ids or []
            # We carry ids, not token strings: the id is given as its own text, as chat does.
            part["logprobs"] = [
                {"token": str(t), "logprob": lp, "bytes": [], "top_logprobs": []} for t, lp in zip(ids, completion.logprobs)
            ]
        items.append(
            {"type": "message", "id": f"msg_{call.call_id}", "role": "assistant", "status": "completed", "content": [part]}
        )
    for i, tc in enumerate(completion.tool_calls):
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{call.call_id}_{i}",
                "call_id": tc.id,
                "name": tc.name,
                "arguments": tc.arguments,
                "status": "completed",
            }
        )
    return items


def _usage(completion: Completion) -> dict[str, Any]:
    p, c = usage_counts(completion)
    return {
        "input_tokens": p,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": c,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": p + c,
    }


def _response(call: PendingCall, completion: Completion | None, output: list[dict[str, Any]]) -> dict[str, Any]:
    request = call.request
    done = completion is not None
    incomplete = done and completion.finish_reason == "length"
    body: dict[str, Any] = {
        "id": response_id(call),
        "object": "response",
        "created_at": int(call.step.timings.requested_at or time.time()),
        "status": ("incomplete" if incomplete else "completed") if done else "in_progress",
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": None,  # they are the request's first message: the policy saw them there
        "model": (completion.model if done else None) or request.model or "policy",
        "output": output,
        "parallel_tool_calls": request.extra.get("parallel_tool_calls", True),
        "temperature": request.sampling.temperature,
        "top_p": request.sampling.top_p,
        "max_output_tokens": request.sampling.max_tokens,
        "tool_choice": _tool_choice_from_chat(request.tool_choice),
        "tools": tools_from_chat(request.tools),
        "metadata": request.metadata,
        "text": {"format": {"type": "text"}},
        "usage": _usage(completion) if done else None,
    }
    if done and completion.prompt_token_ids is not None:
        body["prompt_token_ids"] = completion.prompt_token_ids
    if done and completion.completion_token_ids is not None:
        body["token_ids"] = completion.completion_token_ids
    return body


class ResponsesWire(Wire):
    name = "responses"
    path = "responses"

    def parse(self, data: Any, episode: Episode, content_part_types: Collection[str]) -> ChatRequest:
        return self._read(data, episode, content_part_types)[0]

    def submit(
        self, episode: Episode, data: Any, content_part_types: Collection[str], parent_span_id: str | None = None
    ) -> PendingCall:
        request, conversation = self._read(data, episode, content_part_types)
        call = self.hand_over(episode, request, parent_span_id)
        _stored(episode)[response_id(call)] = _Stored(conversation)
        return call

    def _read(
        self, data: Any, episode: Episode, content_part_types: Collection[str]
    ) -> tuple[ChatRequest, list[dict[str, Any]]]:
        """The request, and its conversation without its instructions (what a later
        ``previous_response_id`` continues)."""
        data = _nulls_absent(data)
        # The SDK's types make a function tool's "strict" required; OpenAI's server (and every
        # client that leaves it out) treats it as optional.
        tools = [{"strict": None, **t} if isinstance(t, dict) else t for t in data.get("tools") or ()]
        # The input items are checked one by one (_check_items): an error then names the item's
        # own type and field, not those of whichever union member got furthest.
        items = data.get("input")
        top = {**data, "input": []} if isinstance(items, list) else data
        check_params({**top, "tools": tools} if tools else top, ResponseCreateParamsBase)
        if isinstance(items, list):
            _check_items(items)
        for key, what in _UNSERVED.items():
            if data.get(key) is not None:
                raise GatewayError(400, f"'{key}': {what} are not served by this gateway; leave it out")
        if data.get("input") is None:
            raise GatewayError(400, "'input' is required: a string or a list of input items")
        instructions = data.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise GatewayError(400, "'instructions' must be a string here (instruction items are not served)")
        conversation: list[dict[str, Any]] = []
        previous = data.get("previous_response_id")
        if previous is not None:
            stored = _stored(episode).get(previous)
            if stored is None or not stored.answered:
                raise GatewayError(
                    400,
                    f"previous_response_id {previous!r:.60} is not a finished response of this episode: a response id "
                    "continues only within the episode that returned it",
                )
            conversation = list(stored.conversation)
        conversation += input_to_messages(data["input"])
        messages = ([{"role": "system", "content": instructions}] if instructions else []) + conversation
        chat: dict[str, Any] = {"model": data.get("model") or "", "messages": messages}
        if data.get("tools"):
            chat["tools"] = tools_to_chat(data["tools"])
        if data.get("tool_choice") is not None:
            chat["tool_choice"] = tool_choice_to_chat(data["tool_choice"])
        for ours, theirs in (
            ("max_tokens", "max_output_tokens"),
            ("temperature", "temperature"),
            ("top_p", "top_p"),
            ("top_logprobs", "top_logprobs"),
            ("metadata", "metadata"),
            ("parallel_tool_calls", "parallel_tool_calls"),
            ("stream", "stream"),
        ):
            if data.get(theirs) is not None:
                chat[ours] = data[theirs]
        if _LOGPROBS in (data.get("include") or ()):
            chat["logprobs"] = True
        if (response_format := _response_format(data.get("text"))) is not None:
            chat["response_format"] = response_format
        # Every field the translation reads passed this wire's schema above, and what it builds
        # from them is a chat request the chat schema accepts: it is not validated again as chat
        # (a second schema pass over the whole conversation). Left are the rules no Responses type
        # states: a non-empty conversation, a boolean stream, content parts the policy renders,
        # then the sampling values' limits (ChatRequest.from_openai).
        check_translated_chat(chat, content_part_types)
        try:
            request = ChatRequest.from_openai(chat)
        except ValueError as exc:
            raise GatewayError(400, str(exc)) from None
        request.wire = self.name
        return request, conversation

    def _answered(self, call: PendingCall, completion: Completion) -> None:
        stored = _stored(call.episode).get(response_id(call))
        if stored is not None and not stored.answered:
            stored.conversation.append(assistant_message(completion))
            stored.answered = True

    def body(self, call: PendingCall, completion: Completion) -> dict[str, Any]:
        self._answered(call, completion)
        return _response(call, completion, output_items(call, completion))

    def events(self, call: PendingCall, completion: Completion) -> list[bytes]:
        self._answered(call, completion)
        items = output_items(call, completion)
        out: list[tuple[str, dict[str, Any]]] = [
            ("response.created", {"response": _response(call, None, [])}),
            ("response.in_progress", {"response": _response(call, None, [])}),
        ]
        for index, item in enumerate(items):
            ids = {"item_id": item["id"], "output_index": index}
            if item["type"] == "message":
                part = item["content"][0]
                out.append(
                    (
                        "response.output_item.added",
                        {"output_index": index, "item": {**item, "status": "in_progress", "content": []}},
                    )
                )
                out.append(("response.content_part.added", {**ids, "content_index": 0, "part": {**part, "text": ""}}))
                if part["text"]:
                    delta = {**ids, "content_index": 0, "delta": part["text"], "logprobs": part.get("logprobs", [])}
                    out.append(("response.output_text.delta", delta))
                done = {**ids, "content_index": 0, "text": part["text"], "logprobs": part.get("logprobs", [])}
                out.append(("response.output_text.done", done))
                out.append(("response.content_part.done", {**ids, "content_index": 0, "part": part}))
            else:
                out.append(
                    (
                        "response.output_item.added",
                        {"output_index": index, "item": {**item, "status": "in_progress", "arguments": ""}},
                    )
                )
                out.append(("response.function_call_arguments.delta", {**ids, "delta": item["arguments"]}))
                out.append(
                    ("response.function_call_arguments.done", {**ids, "name": item["name"], "arguments": item["arguments"]})
                )
            out.append(("response.output_item.done", {"output_index": index, "item": item}))
        final = _response(call, completion, items)
        out.append(("response.incomplete" if final["status"] == "incomplete" else "response.completed", {"response": final}))
        return [sse(name, {"type": name, "sequence_number": n, **payload}) for n, (name, payload) in enumerate(out)]
