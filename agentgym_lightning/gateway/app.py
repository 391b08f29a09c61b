"""The gateway's ASGI app (Starlette): the OpenAI endpoints plus rewards and variables.

Routes (all JSON; errors in OpenAI's ``{"error": {...}}`` shape):

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
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from agentgym_lightning.gateway.openai_wire import ERROR_HEADERS, GatewayError, internal_error, models_body
from agentgym_lightning.gateway.wires import CHAT, WIRES, Wire, unserved_route

if TYPE_CHECKING:
    from agentgym_lightning.gateway.router import EpisodeRouter

EPISODE_HEADER = "x-agentgym-episode"


def _error(exc: GatewayError, wire: Wire = CHAT) -> JSONResponse:
    headers = dict(ERROR_HEADERS)
    if exc.status == 401:
        headers["connection"] = "close"  # an unauthenticated client keeps no connection open
    return JSONResponse(wire.error_body(exc), status_code=exc.status, headers=headers)


def build_app(gateway: EpisodeRouter, extra_routes: Sequence[BaseRoute] = ()) -> Starlette:
    """The Starlette app serving ``gateway`` (plus ``extra_routes``, matched first: the
    standalone gateway's episode API)."""

    def guarded(
        handler: Callable[[Request], Awaitable[Response]], wire: Wire = CHAT
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                gateway.check_auth(wire.credentials(request.headers))
                return await handler(request)
            except GatewayError as exc:
                return _error(exc, wire)
            except ClientDisconnect:
                return Response(status_code=400)  # nobody is left to read it

        return endpoint

    def llm_call(wire: Wire) -> Callable[[Request], Awaitable[Response]]:
        async def call_route(request: Request) -> Response:
            episode_id = request.path_params.get("episode_id") or request.headers.get(EPISODE_HEADER)
            if not episode_id:
                raise GatewayError(
                    404, "no episode in the URL: use the base URL the env handed you (/episodes/<id>/v1) or send X-Agentgym-Episode"
                )
            call = gateway.submit(episode_id, await request.body(), wire, request.headers.get("traceparent"))
            completion = await call.wait_async()
            if call.request.stream:
                chunks = wire.events(call, completion)

                async def events() -> AsyncIterator[bytes]:
                    # An async iterator: Starlette would run a plain one on a worker thread.
                    for chunk in chunks:
                        yield chunk

                return StreamingResponse(events(), media_type="text/event-stream")
            return Response(json.dumps(wire.body(call, completion)), media_type="application/json")

        return guarded(call_route, wire)

    async def models(request: Request) -> Response:
        episode_id = request.path_params.get("episode_id")
        name = gateway.episode(episode_id).model_name if episode_id else "policy"
        return JSONResponse(models_body(name))

    async def rewards(request: Request) -> Response:
        return JSONResponse(gateway.post_reward(request.path_params["episode_id"], await request.body()))

    async def variables(request: Request) -> Response:
        return JSONResponse(gateway.post_variables(request.path_params["episode_id"], await request.body()))

    async def traces(request: Request) -> Response:
        body, media_type = gateway.post_traces(
            request.path_params["episode_id"],
            await request.body(),
            request.headers.get("content-type"),
            request.headers.get("content-encoding"),
        )
        return Response(body, media_type=media_type)

    async def describe(request: Request) -> Response:
        return JSONResponse(gateway.describe(request.path_params["episode_id"]))

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True, "episodes": gateway.episode_count})

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        wire, error = unserved_route(request.method, request.url.path)
        if exc.status_code != 404:
            error = GatewayError(exc.status_code, "method not allowed" if exc.status_code == 405 else str(exc.detail))
        return JSONResponse(wire.error_body(error), status_code=exc.status_code, headers=ERROR_HEADERS)

    async def server_error(request: Request, exc: Exception) -> Response:
        # Starlette logs the traceback; the client gets OpenAI's shape, not plain text.
        return _error(internal_error(exc))

    routes = [
        *extra_routes,
        *(Route(f"/episodes/{{episode_id}}/v1/{path}", llm_call(wire), methods=["POST"]) for path, wire in WIRES.items()),
        *(Route(f"/v1/{path}", llm_call(wire), methods=["POST"]) for path, wire in WIRES.items()),
        Route("/episodes/{episode_id}/v1/models", guarded(models), methods=["GET"]),
        Route("/v1/models", guarded(models), methods=["GET"]),
        Route("/episodes/{episode_id}/rewards", guarded(rewards), methods=["POST"]),
        Route("/episodes/{episode_id}/variables", guarded(variables), methods=["POST"]),
        Route("/episodes/{episode_id}/v1/traces", guarded(traces), methods=["POST"]),
        Route("/episodes/{episode_id}", guarded(describe), methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]
    handlers: dict[Any, Any] = {HTTPException: http_error, Exception: server_error}
    return Starlette(routes=routes, exception_handlers=handlers)
