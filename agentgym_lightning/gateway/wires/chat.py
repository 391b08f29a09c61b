"""The Chat Completions wire (``POST .../v1/chat/completions``): the internal model is this
wire's own request, so it is read and written as it always was (:mod:`..openai_wire`)."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from agentgym_lightning.gateway.openai_wire import completion_body, completion_sse
from agentgym_lightning.gateway.validation import check_chat_request
from agentgym_lightning.gateway.wires.base import Wire
from agentgym_lightning.llm import ChatRequest, Completion, GatewayError

if TYPE_CHECKING:
    from agentgym_lightning.episode import Episode, PendingCall

__all__ = ["ChatWire"]


class ChatWire(Wire):
    name = "chat"
    path = "chat/completions"

    def parse(self, data: Any, episode: Episode, content_part_types: Collection[str]) -> ChatRequest:
        check_chat_request(data, content_part_types)
        try:
            return ChatRequest.from_openai(data)
        except ValueError as exc:
            raise GatewayError(400, str(exc)) from None

    def body(self, call: PendingCall, completion: Completion) -> dict[str, Any]:
        return completion_body(call.request, completion, call.call_id)

    def events(self, call: PendingCall, completion: Completion) -> list[bytes]:
        return completion_sse(call.request, completion, call.call_id)
