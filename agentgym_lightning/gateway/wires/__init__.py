"""The APIs an agent may speak to the gateway, each translated to and from the one internal model
(:class:`~agentgym_lightning.llm.ChatRequest`, :class:`~agentgym_lightning.llm.Completion`).

======================  ==========================  ===========================================
wire (``ChatRequest.wire``)  route under ``/episodes/<id>``  clients
======================  ==========================  ===========================================
``chat``                ``POST /v1/chat/completions``   ``openai`` ``chat.completions``, most frameworks
``responses``           ``POST /v1/responses``          ``openai`` ``responses``, Agents SDK, pydantic-ai
``completions``         ``POST /v1/completions``        legacy text completions (raw prompt)
``messages``            ``POST /v1/messages``           ``anthropic`` SDK (base URL without ``/v1``)
======================  ==========================  ===========================================
"""

from __future__ import annotations

from agentgym_lightning.gateway.wires.anthropic_messages import MessagesWire
from agentgym_lightning.gateway.wires.base import Wire
from agentgym_lightning.gateway.wires.chat import ChatWire
from agentgym_lightning.gateway.wires.completions import CompletionsWire
from agentgym_lightning.gateway.wires.responses import ResponsesWire
from agentgym_lightning.llm import GatewayError

__all__ = ["Wire", "ChatWire", "ResponsesWire", "CompletionsWire", "MessagesWire", "CHAT", "WIRES", "SERVED", "unserved_route"]

CHAT = ChatWire()
#: Every wire by its route under an episode's ``/v1/``.
WIRES: dict[str, Wire] = {w.path: w for w in (CHAT, ResponsesWire(), CompletionsWire(), MessagesWire())}
#: What the gateway serves, as said in every "no route" error.
SERVED = ", ".join(f"POST /v1/{path}" for path in WIRES) + ", GET /v1/models"


def unserved_route(method: str, path: str) -> tuple[Wire, GatewayError]:
    """The 404 for a route no wire serves, and the wire whose error shape it takes (Anthropic's
    for ``.../messages...`` paths, OpenAI's otherwise)."""
    wire = WIRES["messages"] if "/messages" in path else CHAT
    return wire, GatewayError(404, f"no route {method} {path}; this gateway serves {SERVED} (under /episodes/<id>)")
