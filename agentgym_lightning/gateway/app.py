"""The gateway's ASGI app (Starlette): the route table of :mod:`.routes` served over HTTP.

The routes, their checks and their rendering are :mod:`.routes`' (the in-process transport
serves the same table); this module only turns a Starlette request into a
:class:`~agentgym_lightning.gateway.routes.RouteRequest` and a
:class:`~agentgym_lightning.gateway.routes.Reply` into a response.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from agentgym_lightning.gateway.openai_wire import GatewayError, internal_error
from agentgym_lightning.gateway.routes import Reply, RouteRequest, Routes, error_reply, error_wire

if TYPE_CHECKING:
    from agentgym_lightning.gateway.router import EpisodeRouter

_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def _response(reply: Reply) -> Response:
    if reply.events is not None:
        events = reply.events

        async def stream() -> AsyncIterator[bytes]:
            # An async iterator: Starlette would run a plain one on a worker thread.
            for event in events:
                yield event

        return StreamingResponse(stream(), status_code=reply.status, media_type=reply.media_type, headers=reply.headers)
    return Response(reply.body, status_code=reply.status, media_type=reply.media_type, headers=reply.headers)


def build_app(gateway: EpisodeRouter, extra_routes: Sequence[BaseRoute] = ()) -> Starlette:
    """The Starlette app serving ``gateway``'s routes (plus ``extra_routes``, matched first: the
    standalone gateway's episode API)."""
    routes = Routes(gateway)

    async def endpoint(request: Request) -> Response:
        try:
            body = await request.body()
        except ClientDisconnect:
            return Response(status_code=400)  # nobody is left to read it
        route_request = RouteRequest(request.method, request.url.path, request.headers, body)
        return _response(await routes.handle_async(route_request))

    async def http_error(request: Request, exc: Exception) -> Response:
        # Only ``extra_routes`` raise these: every other path is answered by the route table.
        assert isinstance(exc, HTTPException)
        message = "method not allowed" if exc.status_code == 405 else str(exc.detail)
        return _response(error_reply(GatewayError(exc.status_code, message), error_wire(request.url.path)))

    async def server_error(request: Request, exc: Exception) -> Response:
        # Starlette logs the traceback; the client gets OpenAI's shape, not plain text.
        return _response(error_reply(internal_error(exc), error_wire(request.url.path)))

    handlers: dict[Any, Any] = {HTTPException: http_error, Exception: server_error}
    table = Route("/{path:path}", endpoint, methods=_METHODS)
    return Starlette(routes=[*extra_routes, table], exception_handlers=handlers)
