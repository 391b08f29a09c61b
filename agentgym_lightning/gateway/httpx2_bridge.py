"""httpx2 transports that send through an episode's httpx client.

The ``anthropic`` SDK (2.x) is built on ``httpx2``, a fork of ``httpx`` whose clients refuse
``httpx`` objects. These transports hand each of its requests to one of the episode's own httpx
clients (in-process, or over HTTP), so an Anthropic client gets everything those clients have:
no socket in-process, the episode's stop guard, and closing when the episode ends. Needs the
``[anthropic]`` extra (it brings ``httpx2``).
"""

from __future__ import annotations

import httpx
import httpx2

__all__ = ["Httpx2Bridge", "AsyncHttpx2Bridge"]


def _request(request: httpx2.Request) -> httpx.Request:
    return httpx.Request(request.method, str(request.url), headers=request.headers.raw, content=request.content)


def _response(response: httpx.Response, request: httpx2.Request) -> httpx2.Response:
    # Our answers are rendered whole (streamed ones too), so reading them here loses nothing.
    return httpx2.Response(response.status_code, headers=response.headers.raw, content=response.content, request=request)


class Httpx2Bridge(httpx2.BaseTransport):
    """For ``anthropic.Anthropic``: each request sent with ``client`` (an episode's httpx client)."""

    def __init__(self, client: httpx.Client) -> None:
        self._client = client

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        request.read()
        return _response(self._client.send(_request(request)), request)

    def close(self) -> None:
        self._client.close()


class AsyncHttpx2Bridge(httpx2.AsyncBaseTransport):
    """For ``anthropic.AsyncAnthropic``: each request sent with ``client`` (an async httpx client)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        await request.aread()
        return _response(await self._client.send(_request(request)), request)

    async def aclose(self) -> None:
        await self._client.aclose()
