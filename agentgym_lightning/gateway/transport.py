"""In-process transports: an ``openai`` client in the same process reaches its episode with no
socket and no server, with exactly the HTTP app's semantics."""

from __future__ import annotations

import json
import logging
import re
from typing import TYPE_CHECKING

import httpx

from agentgym_lightning.gateway.openai_wire import ERROR_HEADERS, GatewayError, internal_error, models_body
from agentgym_lightning.gateway.wires import CHAT, WIRES, Wire, unserved_route

if TYPE_CHECKING:
    from agentgym_lightning.episode import PendingCall
    from agentgym_lightning.gateway.router import EpisodeRouter

log = logging.getLogger(__name__)

_CALL = re.compile(r"^/episodes/([^/]+)/v1/(" + "|".join(map(re.escape, WIRES)) + r")$")
_MODELS = re.compile(r"^/episodes/([^/]+)/v1/models$")
_POST = re.compile(r"^/episodes/([^/]+)/(rewards|variables)$")
_TRACES = re.compile(r"^/episodes/([^/]+)/v1/traces$")


def _json(status: int, payload: object, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(
        status, content=json.dumps(payload).encode(), headers={"content-type": "application/json", **(headers or {})}
    )


def _error(exc: GatewayError, wire: Wire = CHAT) -> httpx.Response:
    return _json(exc.status, wire.error_body(exc), ERROR_HEADERS)


class _Requests:
    """An httpx request against the router's routes: begun (checked, handed over) and finished
    (the answer rendered as the HTTP app renders it)."""

    def __init__(self, gateway: EpisodeRouter) -> None:
        self.gateway = gateway

    def begin(self, request: httpx.Request) -> tuple[PendingCall, Wire] | httpx.Response:
        """Route a request: a pending call to wait on (and the wire to answer it in), or a
        finished response."""
        path, method = request.url.path, request.method
        call = _CALL.match(path) if method == "POST" else None
        wire = WIRES[call.group(2)] if call else CHAT
        try:
            self.gateway.check_auth(wire.credentials(request.headers))
            if call:
                return self.gateway.submit(call.group(1), request.content, wire, request.headers.get("traceparent")), wire
            if method == "GET" and (m := _MODELS.match(path)):
                return _json(200, models_body(self.gateway.episode(m.group(1)).model_name))
            if method == "POST" and (m := _POST.match(path)):
                fn = self.gateway.post_reward if m.group(2) == "rewards" else self.gateway.post_variables
                return _json(200, fn(m.group(1), request.content))
            if method == "POST" and (m := _TRACES.match(path)):
                headers = request.headers
                body, media_type = self.gateway.post_traces(
                    m.group(1), request.content, headers.get("content-type"), headers.get("content-encoding")
                )
                return httpx.Response(200, content=body, headers={"content-type": media_type})
            wire, error = unserved_route(method, path)
            raise error
        except GatewayError as exc:
            return _error(exc, wire)
        except Exception as exc:  # noqa: BLE001 - a bug of ours: the wire's shape, as over HTTP
            log.exception("gateway: %s %s failed", method, path)
            return _error(internal_error(exc), wire)

    @staticmethod
    def finish(call: PendingCall, wire: Wire) -> httpx.Response:
        try:
            completion = call._result()
        except GatewayError as exc:
            return _error(exc, wire)
        if call.request.stream:
            return httpx.Response(
                200,
                headers={"content-type": "text/event-stream"},
                stream=httpx.ByteStream(b"".join(wire.events(call, completion))),
            )
        return _json(200, wire.body(call, completion))


class InProcessTransport(httpx.BaseTransport):
    """For ``openai.OpenAI``: the calling thread blocks until the driver answers."""

    def __init__(self, gateway: EpisodeRouter) -> None:
        self._requests = _Requests(gateway)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()
        result = self._requests.begin(request)
        if isinstance(result, httpx.Response):
            return result
        try:
            result[0].wait()
        except GatewayError:
            pass  # rendered by finish()
        return self._requests.finish(*result)


class AsyncInProcessTransport(httpx.AsyncBaseTransport):
    """For ``openai.AsyncOpenAI``: the calling task awaits the driver's answer."""

    def __init__(self, gateway: EpisodeRouter) -> None:
        self._requests = _Requests(gateway)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        result = self._requests.begin(request)
        if isinstance(result, httpx.Response):
            return result
        try:
            await result[0].wait_async()
        except GatewayError:
            pass
        return self._requests.finish(*result)
