"""The APIs an agent may speak to the gateway, each translated to and from the one internal model
(:class:`~agentgym_lightning.llm.ChatRequest`, :class:`~agentgym_lightning.llm.Completion`).

- ``chat`` (``POST /episodes/<id>/v1/chat/completions``): ``openai`` ``chat.completions``, most frameworks;
- ``responses`` (``.../v1/responses``): ``openai`` ``responses``, the Agents SDK's and pydantic-ai's
  default models;
- ``completions`` (``.../v1/completions``): legacy text completions, a raw prompt;
- ``messages`` (``.../v1/messages``): the ``anthropic`` SDK, whose base URL is the episode's
  without ``/v1``.

The name is what a step records as ``ChatRequest.wire``.
"""

from __future__ import annotations

from agentgym_lightning.gateway.wires.anthropic_messages import MessagesWire
from agentgym_lightning.gateway.wires.base import Wire
from agentgym_lightning.gateway.wires.chat import ChatWire
from agentgym_lightning.gateway.wires.completions import CompletionsWire
from agentgym_lightning.gateway.wires.responses import ResponsesWire
from agentgym_lightning.llm import GatewayError

__all__ = [
    "Wire",
    "ChatWire",
    "ResponsesWire",
    "CompletionsWire",
    "MessagesWire",
    "CHAT",
    "WIRES",
    "SERVED",
    "unserved_route",
]

CHAT = ChatWire()
#: Every wire by its route under an episode's ``/v1/``.
WIRES: dict[str, Wire] = {w.path: w for w in (CHAT, ResponsesWire(), CompletionsWire(), MessagesWire())}
#: What the gateway serves, as said in every "no route" error.
SERVED = ", ".join(f"POST /v1/{path}" for path in WIRES) + ", GET /v1/models, POST /v1/traces (OTLP)"


def unserved_route(method: str, path: str) -> tuple[Wire, GatewayError]:
    """The 404 for a route no wire serves, and the wire whose error shape it takes (Anthropic's
    for ``.../messages...`` paths, OpenAI's otherwise)."""
    wire = WIRES["messages"] if "/messages" in path else CHAT
    return wire, GatewayError(404, f"no route {method} {path}; this gateway serves {SERVED} (under /episodes/<id>)")
