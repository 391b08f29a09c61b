"""The gateway's route table and its rendering: one source for both ways an agent reaches the
router, the HTTP app (:mod:`.app`) and the in-process transport (:mod:`.transport`).

Routes (all JSON; errors in the shape of the route's wire, OpenAI's ``{"error": {...}}`` unless
the wire says otherwise):

- ``POST /episodes/{id}/v1/chat/completions`` — an agent's LLM call (``stream`` supported); and
  the same call on the other wires (:mod:`.wires`): ``/v1/responses`` (OpenAI Responses API),
  ``/v1/completions`` (legacy), ``/v1/messages`` (Anthropic), each answering and erring in its
  own shape.
- ``GET  /episodes/{id}/v1/models`` and ``GET /v1/models`` — the served model name.
- ``POST /v1/chat/completions`` (and every wire's ``/v1/...``) with header
  ``X-Agentgym-Episode: {id}`` — for clients whose base URL cannot carry the episode.
- ``POST /episodes/{id}/rewards`` — ``{"value": 1.0, "source": "judge"}``.
- ``POST /episodes/{id}/variables`` — ``{"name": value, ...}``.
- ``POST /episodes/{id}/v1/traces`` — the agent's OpenTelemetry spans (OTLP/HTTP, protobuf or
  JSON: ``OTEL_EXPORTER_OTLP_ENDPOINT=http://.../episodes/{id}``).
- ``GET  /episodes/{id}`` — progress; ``GET /health``.

A request is a :class:`RouteRequest` (method, path, headers, body) and every answer a
:class:`Reply` (status, JSON body or server-sent events, headers); the app and the transport
only translate their framework's request and response objects to and from these. Checking a
request (strict JSON, the wire's schema) holds the GIL in pydantic-core; a body larger than
:data:`INLINE_BODY_BYTES` is checked on a worker thread, so an event loop serving other episodes'
calls is never blocked by it (and every body's work is bounded: ``docs/limits.md``).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from agentgym_lightning.gateway.openai_wire import ERROR_HEADERS, GatewayError, internal_error, models_body
from agentgym_lightning.gateway.wires import CHAT, WIRES, Wire, unserved_route

if TYPE_CHECKING:
    from agentgym_lightning.episode import PendingCall
    from agentgym_lightning.gateway.router import EpisodeRouter

__all__ = ["EPISODE_HEADER", "INLINE_BODY_BYTES", "ROUTES", "Route", "RouteRequest", "Reply", "Routes", "error_wire"]

log = logging.getLogger(__name__)

#: The header naming the episode for clients whose base URL cannot carry it (``/v1/...`` routes).
EPISODE_HEADER = "x-agentgym-episode"
#: Bodies up to this size are checked where the request arrives (cheap: microseconds to a few
#: milliseconds); larger ones on a worker thread.
INLINE_BODY_BYTES = 64 * 2**10


@dataclass(frozen=True)
class RouteRequest:
    """One request, whichever way it came (``headers`` keys are looked up lower-case)."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes = b""


@dataclass
class Reply:
    """One answer: a JSON ``body``, or server-sent ``events`` (a streamed call)."""

    status: int
    body: bytes = b""
    media_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    events: list[bytes] | None = None

    @classmethod
    def json(cls, payload: Any, status: int = 200) -> Reply:
        return cls(status, json.dumps(payload).encode())


def error_reply(exc: GatewayError, wire: Wire = CHAT) -> Reply:
    """``exc`` in ``wire``'s error shape, with the headers every refusal carries."""
    headers = dict(ERROR_HEADERS)
    if exc.status == 401:
        headers["connection"] = "close"  # an unauthenticated client keeps no connection open
    return Reply(exc.status, json.dumps(wire.error_body(exc)).encode(), headers=headers)


Handler = Callable[["EpisodeRouter", RouteRequest, Mapping[str, str], Wire], "Reply | PendingCall"]


@dataclass(frozen=True)
class Route:
    """``method`` on ``path`` (``{name}`` matches one path segment) is answered by ``handler`` in
    ``wire``'s shape (its credentials, its errors); ``auth``: whether the bearer token is checked."""

    method: str
    path: str
    handler: Handler
    wire: Wire = CHAT
    auth: bool = True

    @property
    def pattern(self) -> re.Pattern[str]:
        return _compile(self.path)


_PATTERNS: dict[str, re.Pattern[str]] = {}


def _compile(path: str) -> re.Pattern[str]:
    if path not in _PATTERNS:
        parts = re.split(r"\{(\w+)\}", path)
        regex = "".join(f"(?P<{p}>[^/]+)" if i % 2 else re.escape(p) for i, p in enumerate(parts))
        _PATTERNS[path] = re.compile(f"^{regex}$")
    return _PATTERNS[path]


# ------------------------------------------------------------------------------------ handlers


def _call(router: EpisodeRouter, request: RouteRequest, params: Mapping[str, str], wire: Wire) -> PendingCall:
    episode_id = params.get("episode_id") or request.headers.get(EPISODE_HEADER)
    if not episode_id:
        raise GatewayError(
            404, "no episode in the URL: use the base URL the env handed you (/episodes/<id>/v1) or send X-Agentgym-Episode"
        )
    return router.submit(episode_id, request.body, wire, request.headers.get("traceparent"))


def _models(router: EpisodeRouter, request: RouteRequest, params: Mapping[str, str], wire: Wire) -> Reply:
    episode_id = params.get("episode_id")
    return Reply.json(models_body(router.episode(episode_id).model_name if episode_id else "policy"))


def _rewards(router: EpisodeRouter, request: RouteRequest, params: Mapping[str, str], wire: Wire) -> Reply:
    return Reply.json(router.post_reward(params["episode_id"], request.body))


def _variables(router: EpisodeRouter, request: RouteRequest, params: Mapping[str, str], wire: Wire) -> Reply:
    return Reply.json(router.post_variables(params["episode_id"], request.body))


def _traces(router: EpisodeRouter, request: RouteRequest, params: Mapping[str, str], wire: Wire) -> Reply:
    body, media_type = router.post_traces(
        params["episode_id"], request.body, request.headers.get("content-type"), request.headers.get("content-encoding")
    )
    return Reply(200, body, media_type)


def _describe(router: EpisodeRouter, request: RouteRequest, params: Mapping[str, str], wire: Wire) -> Reply:
    return Reply.json(router.describe(params["episode_id"]))


def _health(router: EpisodeRouter, request: RouteRequest, params: Mapping[str, str], wire: Wire) -> Reply:
    return Reply.json({"ok": True, "episodes": router.episode_count})


#: Every route the gateway serves, matched in order.
ROUTES: tuple[Route, ...] = (
    *(Route("POST", f"/episodes/{{episode_id}}/v1/{path}", _call, wire) for path, wire in WIRES.items()),
    *(Route("POST", f"/v1/{path}", _call, wire) for path, wire in WIRES.items()),
    Route("GET", "/episodes/{episode_id}/v1/models", _models),
    Route("GET", "/v1/models", _models),
    Route("POST", "/episodes/{episode_id}/rewards", _rewards),
    Route("POST", "/episodes/{episode_id}/variables", _variables),
    Route("POST", "/episodes/{episode_id}/v1/traces", _traces),
    Route("GET", "/episodes/{episode_id}", _describe),
    Route("GET", "/health", _health, auth=False),
)


def _match(method: str, path: str) -> tuple[Route, dict[str, str]] | tuple[None, int]:
    """The route serving ``method path`` and its path parameters, or ``(None, 404 or 405)``."""
    method = "GET" if method == "HEAD" else method
    status = 404
    for route in ROUTES:
        m = route.pattern.match(path)
        if m is not None:
            if route.method == method:
                return route, m.groupdict()
            status = 405
    return None, status


def error_wire(path: str) -> Wire:
    """The wire whose error shape answers a request for ``path`` (whatever its method), also
    when it is refused before it is routed (a 413 while its body arrives)."""
    for route in ROUTES:
        if route.pattern.match(path):
            return route.wire
    return unserved_route("POST", path)[0]


class Routes:
    """The route table bound to one router: a request in, a :class:`Reply` out."""

    def __init__(self, router: EpisodeRouter) -> None:
        self.router = router

    def begin(self, request: RouteRequest) -> tuple[PendingCall, Wire] | Reply:
        """Route ``request``: a pending call to wait on (and the wire to answer it in), or a
        finished reply (an answer, or a refusal in the route's wire shape)."""
        route, found = _match(request.method, request.path)
        wire = route.wire if route is not None else error_wire(request.path)
        try:
            if route is None or route.auth:
                self.router.check_auth(wire.credentials(request.headers))
            if route is None:
                _, error = unserved_route(request.method, request.path)
                if found == 405:
                    error = GatewayError(405, "method not allowed")
                raise error
            result = route.handler(self.router, request, found, wire)  # type: ignore[arg-type]
            return result if isinstance(result, Reply) else (result, wire)
        except GatewayError as exc:
            return error_reply(exc, wire)
        except Exception as exc:  # noqa: BLE001 - a bug of ours: logged, answered in the wire's shape
            log.exception("gateway: %s %s failed", request.method, request.path)
            return error_reply(internal_error(exc), wire)

    @staticmethod
    def finish(call: PendingCall, wire: Wire) -> Reply:
        """The answered (or refused) ``call`` rendered in ``wire``'s shape."""
        try:
            completion = call._result()
        except GatewayError as exc:
            return error_reply(exc, wire)
        try:
            if call.request.stream:
                return Reply(200, media_type="text/event-stream", events=wire.events(call, completion))
            return Reply.json(wire.body(call, completion))
        except Exception as exc:  # noqa: BLE001 - never a dropped connection: the wire's 500
            log.exception("gateway: rendering the answer to call %s failed", call.call_id)
            return error_reply(internal_error(exc), wire)

    def handle(self, request: RouteRequest) -> Reply:
        """Answer ``request``, blocking the calling thread until its call (if any) is answered."""
        begun = self.begin(request)
        if isinstance(begun, Reply):
            return begun
        try:
            begun[0].wait()
        except GatewayError:
            pass  # rendered by finish()
        return self.finish(*begun)

    async def handle_async(self, request: RouteRequest) -> Reply:
        """Answer ``request`` on an event loop: a large body is checked on a worker thread."""
        if len(request.body) > INLINE_BODY_BYTES:
            begun = await anyio.to_thread.run_sync(self.begin, request)
        else:
            begun = self.begin(request)
        if isinstance(begun, Reply):
            return begun
        try:
            await begun[0].wait_async()
        except GatewayError:
            pass
        return self.finish(*begun)
