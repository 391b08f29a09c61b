"""What one wire is: an API an agent speaks to the gateway, translated to and from the one
internal model (:class:`~agentgym_lightning.llm.ChatRequest` in, :class:`~agentgym_lightning.llm.Completion`
out).

A wire reads its request body into a ``ChatRequest`` (refusing what it cannot translate with a
:class:`GatewayError`), renders the answer as its own response body or its own server-sent
events, and renders errors in its own shape. The HTTP app and the in-process transport route
each path to its wire and do the rest the same way for all of them.
"""

from __future__ import annotations

import json
import threading
import warnings
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from agentgym_lightning.gateway.openai_wire import error_body
from agentgym_lightning.llm import ChatRequest, Completion, GatewayError

if TYPE_CHECKING:
    from agentgym_lightning.episode import Episode, PendingCall

__all__ = ["Wire", "RepeatedUserTurnWarning", "sse", "usage_counts"]


class RepeatedUserTurnWarning(UserWarning):
    """A request repeats its last user turn (:attr:`ChatRequest.repeated_user_turn`): warned once
    per process."""


_repeat_warned = False
_repeat_lock = threading.Lock()


def _warn_repeated_user_turn(wire: str) -> None:
    global _repeat_warned
    with _repeat_lock:
        first, _repeat_warned = not _repeat_warned, True
    if first:
        warnings.warn(
            f"a request on the {wire!r} wire repeats its last user turn (the same user message twice in a row), as "
            "Semantic Kernel's OpenAIResponsesAgent sends every user turn: the policy sees, and is trained on, the "
            "turn twice. Such steps are kept and flagged (step.request.repeated_user_turn, counted as "
            "samples/calls/repeated_user_turn); send the turn once in the agent, or leave them out of training with "
            "agent_match=lambda step: not step.request.repeated_user_turn (said once per process)",
            RepeatedUserTurnWarning,
            stacklevel=2,
        )


class Wire:
    """One API the gateway serves (subclass per wire; instances hold no state of their own)."""

    #: Recorded as ``ChatRequest.wire`` on every step that came this way.
    name: ClassVar[str]
    #: The route under an episode's ``/v1/`` (``"chat/completions"``, ``"responses"``...).
    path: ClassVar[str]

    def parse(self, data: dict[str, Any], episode: Episode, content_part_types: Collection[str]) -> ChatRequest:
        """The request body (already parsed as a strict JSON object) as a ``ChatRequest``; raises a 4xx
        :class:`GatewayError` saying what is wrong before anything is recorded."""
        raise NotImplementedError

    def submit(
        self,
        episode: Episode,
        data: dict[str, Any],
        content_part_types: Collection[str],
        parent_span_id: str | None = None,
    ) -> PendingCall:
        """Read the body (:meth:`parse`) and hand the call to ``episode``; a wire that keeps
        state of its own per call (the Responses API's stored responses) records it here.
        ``parent_span_id``: the agent's span the call was made inside, if known (see
        :func:`agentgym_lightning.tracing.processor.call_parent`)."""
        return self.hand_over(episode, self.parse(data, episode, content_part_types), parent_span_id)

    def hand_over(self, episode: Episode, request: ChatRequest, parent_span_id: str | None) -> PendingCall:
        """Hand the checked ``request`` to ``episode`` (every wire's last step), warning once per
        process when it repeats its last user turn (:class:`RepeatedUserTurnWarning`); the
        request itself is recorded and answered as any other."""
        if request.repeated_user_turn:
            _warn_repeated_user_turn(self.name)
        return episode.submit(request, parent_span_id)

    def body(self, call: PendingCall, completion: Completion) -> dict[str, Any]:
        """The non-streamed response body answering ``call``."""
        raise NotImplementedError

    def events(self, call: PendingCall, completion: Completion) -> list[bytes]:
        """The same answer as this wire's server-sent events."""
        raise NotImplementedError

    def error_body(self, exc: GatewayError) -> dict[str, Any]:
        """``exc`` in this wire's error shape (OpenAI's unless overridden)."""
        return error_body(exc.status, exc.message, exc.code)

    def credentials(self, headers: Mapping[str, str]) -> str | None:
        """The ``Authorization`` value to check (a wire whose clients send their key in another
        header turns it into ``Bearer <key>``)."""
        return headers.get("authorization")


def sse(event: str | None, payload: Any) -> bytes:
    """One server-sent event: ``event: <name>`` (when named) and its JSON ``data``."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(payload)}\n\n".encode()


def usage_counts(completion: Completion) -> tuple[int, int]:
    """Prompt and completion token counts (0 where a backend returned no ids: never guessed)."""
    return len(completion.prompt_token_ids or ()), len(completion.completion_token_ids or ())
