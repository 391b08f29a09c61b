"""The gateway's router: the registry of running episodes, the bearer-token check, and each
request handed to its episode.

Both ways an agent reaches the gateway route through here with the same semantics: the HTTP app
(:mod:`.app`) and the in-process transport (:mod:`.transport`). What listens on a socket, and
what an agent is handed to reach it, is :class:`~agentgym_lightning.gateway.gateway.Gateway`'s.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from agentgym_lightning.episode import Episode, PendingCall
from agentgym_lightning.gateway.auth import check_bearer
from agentgym_lightning.gateway.limits import GatewayLimits
from agentgym_lightning.gateway.openai_wire import GatewayError
from agentgym_lightning.gateway.otlp import export_response, parse_export_request
from agentgym_lightning.gateway.validation import check_item_counts, parse_json
from agentgym_lightning.gateway.wires import CHAT, Wire
from agentgym_lightning.llm import MAX_TOKENS_LIMIT
from agentgym_lightning.tracing.processor import call_parent

__all__ = ["EpisodeRouter"]

#: The fields in which the wires' requests name how many tokens a call may generate.
_GENERATION_LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


class EpisodeRouter:
    """Running episodes by id, and the requests of their agents: checked, then handed over.

    Args:
        token: Bearer token every request must send; ``None``: none is checked.
        limits: Bounds on request sizes (see
            :class:`~agentgym_lightning.gateway.limits.GatewayLimits` and ``docs/limits.md``).
    """

    def __init__(self, token: str | None = None, limits: GatewayLimits | None = None) -> None:
        self.token = token
        self.limits = limits or GatewayLimits()
        self._episodes: dict[str, Episode] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ episodes

    def register(self, episode: Episode) -> None:
        with self._lock:
            self._episodes[episode.episode_id] = episode

    def unregister(self, episode_id: str) -> None:
        with self._lock:
            self._episodes.pop(episode_id, None)

    def episode(self, episode_id: str) -> Episode:
        ep = self._episodes.get(episode_id)
        if ep is None:
            raise GatewayError(
                404, f"no running episode {episode_id!r}: it ended or never existed; use the base URL the env handed you"
            )
        return ep

    @property
    def episode_count(self) -> int:
        return len(self._episodes)

    # ------------------------------------------------------------------ requests

    def check_auth(self, authorization: str | None) -> None:
        """Raise a 401 :class:`GatewayError` unless ``authorization`` carries the token (see :mod:`.auth`)."""
        check_bearer(authorization, self.token)

    def submit(
        self, episode_id: str, body: bytes | Mapping[str, Any], wire: Wire = CHAT, traceparent: str | None = None
    ) -> PendingCall:
        """Check a request of ``wire`` (chat completions by default; see :mod:`.wires`) fully,
        then hand it to its episode as a pending call; ``traceparent``: the W3C
        trace context the request came with, if any (which agent span made the call).

        Everything that can make it fail is checked before the episode records a step: a
        refused request (a :class:`GatewayError`) leaves no trace in the trajectory.
        ``traceparent``: the request's W3C trace context header (without one, an in-process
        caller's current span), which joins the agent's spans to the call.
        """
        episode = self.episode(episode_id)
        episode.raise_if_stopped()
        parent = call_parent({"traceparent": traceparent} if traceparent else None)
        data = self.json_object(body)
        limits = self.limits
        check_item_counts(data, limits.max_messages, limits.max_tools, limits.max_object_keys)
        return wire.submit(episode, self._capped(data), self.limits.content_part_types, parent)

    def _capped(self, data: dict[str, Any]) -> dict[str, Any]:
        """``data`` with every generation limit it names (``max_tokens``, ``max_completion_tokens``,
        ``max_output_tokens``, whichever its wire reads) at most ``max_completion_tokens``: a
        call asking for more is generated up to the cap and ends ``"length"``, as OpenAI ends a
        call that reaches its own limit."""
        cap = self.limits.max_completion_tokens
        over = {
            key: cap
            for key in _GENERATION_LIMITS
            # anything else (not an integer, past MAX_TOKENS_LIMIT) is the wire's to refuse
            if type(value := data.get(key)) is int and cap < value <= MAX_TOKENS_LIMIT
        }
        return {**data, **over} if over else data

    def post_traces(
        self, episode_id: str, body: bytes, content_type: str | None, content_encoding: str | None = None
    ) -> tuple[bytes, str]:
        """``POST /episodes/{id}/v1/traces``: an OTLP/HTTP export (protobuf or JSON) of the agent's
        spans, joined to its calls; returns the OTLP response body and its media type. A bad
        request is refused whole (4xx) before any span is kept."""
        episode = self.episode(episode_id)
        records = parse_export_request(body, content_type, content_encoding, self.limits)
        episode.record_spans(records)
        return export_response(content_type)

    def post_reward(self, episode_id: str, body: bytes | Mapping[str, Any]) -> dict[str, Any]:
        """``POST /episodes/{id}/rewards`` with ``{"value": 1.0, "source": "..."}``."""
        data = self.json_object(body)
        episode = self.episode(episode_id)
        value = data.get("value")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise GatewayError(400, f"a reward needs a 'value' that is a number (and optionally a 'source'), got {value!r:.40}")
        try:
            episode.emit_reward(value, str(data.get("source", "agent")))
        except ValueError as exc:
            raise GatewayError(400, str(exc)) from None
        return {"ok": True}

    def post_variables(self, episode_id: str, body: bytes | Mapping[str, Any]) -> dict[str, Any]:
        """``POST /episodes/{id}/variables`` with an object of ``name: value`` pairs."""
        data = self.json_object(body)
        episode = self.episode(episode_id)
        if "" in data:
            raise GatewayError(400, "a semantic variable needs a non-empty name; got \"\"")
        for name, value in data.items():
            try:
                episode.emit_variable(name, value)
            except ValueError as exc:  # over a limit: the client's fault
                raise GatewayError(400, str(exc)) from None
        return {"ok": True, "variables": sorted(data)}

    def _parse(self, body: bytes | Mapping[str, Any]) -> Any:
        return parse_json(body, max_bytes=self.limits.max_body_bytes, max_values=self.limits.max_json_values)

    def json_object(self, body: bytes | Mapping[str, Any]) -> dict[str, Any]:
        """``body`` parsed by the strict parser (``max_body_bytes``, ``max_json_values``, depth,
        UTF-8, no NaN or Infinity: :func:`~agentgym_lightning.gateway.validation.parse_json`), or a
        400/413 if it is not a JSON object. Every route with a JSON body uses it (the standalone
        server's too)."""
        data = self._parse(body)
        if not isinstance(data, dict):
            raise GatewayError(400, "request body must be a JSON object")
        return data

    def describe(self, episode_id: str) -> dict[str, Any]:
        """``GET /episodes/{id}``: where the episode stands."""
        ep = self.episode(episode_id)
        return {"episode_id": ep.episode_id, "steps": len(ep.trajectory.steps), "status": ep.trajectory.status.value}
