"""In-process transports: an ``openai`` client in the same process reaches its episode with no
socket and no server, through the HTTP app's own route table (:mod:`.routes`): the same routes,
checks, answers and errors."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx

from agentgym_lightning.gateway.routes import Reply, RouteRequest, Routes

if TYPE_CHECKING:
    from agentgym_lightning.gateway.router import EpisodeRouter


def _route_request(request: httpx.Request) -> RouteRequest:
    return RouteRequest(request.method, request.url.path, request.headers, request.content)


def _response(reply: Reply) -> httpx.Response:
    headers = {"content-type": reply.media_type, **reply.headers}
    if reply.events is not None:
        return httpx.Response(reply.status, headers=headers, stream=httpx.ByteStream(b"".join(reply.events)))
    return httpx.Response(reply.status, content=reply.body, headers=headers)


class InProcessTransport(httpx.BaseTransport):
    """For ``openai.OpenAI``: the calling thread blocks until the driver answers."""

    def __init__(self, gateway: EpisodeRouter) -> None:
        self._routes = Routes(gateway)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()
        return _response(self._routes.handle(_route_request(request)))


class AsyncInProcessTransport(httpx.AsyncBaseTransport):
    """For ``openai.AsyncOpenAI``: the calling task awaits the driver's answer."""

    def __init__(self, gateway: EpisodeRouter) -> None:
        self._routes = Routes(gateway)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        return _response(await self._routes.handle_async(_route_request(request)))
