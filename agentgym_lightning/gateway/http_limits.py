"""Where the HTTP server enforces :class:`~agentgym_lightning.gateway.limits.GatewayLimits`.

uvicorn has a knob for keep-alive idleness (``timeout_keep_alive``, which we set) but none for a
request head's size or time, nor a cap that keeps sockets from using up file descriptors
(``limit_concurrency`` answers 503 *after* accepting and reading a request, so idle sockets
still hold descriptors). So:

- :class:`LimitedHttpToolsProtocol` — uvicorn's own httptools protocol plus what is per
  connection: the head must arrive within ``header_timeout`` and ``max_header_bytes`` (counted as
  bytes arrive: httptools would otherwise buffer a 10 MB header whole), and at
  ``max_connections`` the connection waiting longest for a request is closed. Malformed HTTP gets
  an OpenAI-shaped 400 rather than uvicorn's plain text.
- :class:`BodyLimitMiddleware` — ASGI middleware for what is per request: a declared
  ``Content-Length`` over ``max_body_bytes`` is refused before any body is read, a chunked body
  as soon as it passes the limit (uvicorn reads a body only as fast as the app receives it, so
  nothing more is buffered), and the whole body must arrive within ``body_timeout``.

Time a call spends waiting for its completion is never counted against a connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from agentgym_lightning.gateway.limits import GatewayLimits
from agentgym_lightning.gateway.openai_wire import ERROR_HEADERS, GatewayError, error_body
from agentgym_lightning.gateway.validation import body_too_large

__all__ = ["LimitedHttpToolsProtocol", "BodyLimitMiddleware"]

log = logging.getLogger(__name__)


def _error_bytes(status: int, message: str, code: str) -> bytes:
    """A complete HTTP/1.1 error response that closes the connection."""
    body = json.dumps(error_body(status, message, code)).encode()
    head = [STATUS_LINE[status]]
    for name, value in (
        ("content-type", "application/json"),
        ("content-length", str(len(body))),
        ("connection", "close"),
        *ERROR_HEADERS.items(),
    ):
        head.append(f"{name}: {value}\r\n".encode())
    return b"".join(head) + b"\r\n" + body


class _Refused(Exception):
    """Raised from a parser callback to stop parsing; answered by ``_refuse``."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with head-size, head-time and connection-count limits."""

    _last_cap_warning = 0.0

    def __init__(self, *args: Any, limits: GatewayLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self.cap = limits.connection_cap()
        self._awaiting_head = True  # between requests, or reading a head
        self._head_bytes = 0  # bytes received since this head began (may include a little body)
        self._head_exact = 0  # the parsed head's size, when it completes
        self._head_timer: asyncio.TimerHandle | None = None
        self._completed_requests = 0
        self._waiting_since = time.monotonic()

    # ------------------------------------------------------------------ connection lifecycle

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()
        if len(self.connections) > self.cap:
            self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def _make_room(self) -> None:
        """Over the cap: close the connection that has waited longest for a request (one that
        never completed a request first), or this new one if every other is busy."""
        waiting = [p for p in self.connections if isinstance(p, LimitedHttpToolsProtocol) and p._waiting_for_request()]
        victim = min(waiting, key=lambda p: (p._completed_requests > 0, p._waiting_since), default=self)
        now = time.monotonic()
        if now - LimitedHttpToolsProtocol._last_cap_warning > 10.0:
            LimitedHttpToolsProtocol._last_cap_warning = now
            log.warning(
                "gateway: %d open connections, the cap is %d (GatewayLimits.max_connections): closing the one "
                "waiting longest for a request",
                len(self.connections),
                self.cap,
            )
        victim.transport.close()
        self.connections.discard(victim)

    def _waiting_for_request(self) -> bool:
        return self._awaiting_head and not self.pipeline and (self.cycle is None or self.cycle.response_complete)

    def on_response_complete(self) -> None:
        self._completed_requests += 1
        self._waiting_since = time.monotonic()
        super().on_response_complete()

    # ------------------------------------------------------------------ the request head

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.limits.header_timeout, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self._head_bytes:
            message = f"the request head did not arrive within {self.limits.header_timeout} s"
            self.transport.write(_error_bytes(408, message, "request_timeout"))
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        # uvicorn's data_received, with parse errors answered in OpenAI's shape (and a refused
        # head not logged as "Invalid HTTP request"); no websockets on this server.
        if self._awaiting_head:
            self._head_bytes += len(data)
            self._arm_head_timer()  # a kept-alive connection's next request: its clock starts now
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(_Refused(400, "protocol upgrades (websockets) are not served here", "invalid_request_error"))
            return
        except httptools.HttpParserError as exc:
            refusal = exc.__context__ if isinstance(exc.__context__, _Refused) else None
            self._refuse(refusal or _Refused(400, f"invalid HTTP request: {exc}", "invalid_request_error"))
            return
        if self._awaiting_head and self._head_bytes > self.limits.max_header_bytes:
            self._refuse(_head_too_large(self.limits.max_header_bytes))

    def on_message_begin(self) -> None:
        self._head_exact = 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._head_exact += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_exact += len(name) + len(value) + 4
        if self._head_exact > self.limits.max_header_bytes:
            raise _head_too_large(self.limits.max_header_bytes)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._awaiting_head = False
        self._head_bytes = 0
        self._disarm_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._awaiting_head = True  # what follows on this connection is the next request's head

    def _refuse(self, refusal: _Refused) -> None:
        self._disarm_head_timer()
        if not self.transport.is_closing():
            self.transport.write(_error_bytes(refusal.status, refusal.message, refusal.code))
            self.transport.close()


def _head_too_large(limit: int) -> _Refused:
    return _Refused(
        431,
        f"request head (request line and headers) is larger than {limit} bytes; send less, or raise the "
        "gateway's max_header_bytes (AGENTGYM_LIGHTNING_GATEWAY_MAX_HEADER_BYTES)",
        "request_header_fields_too_large",
    )


class BodyLimitMiddleware:
    """Refuses bodies over ``max_body_bytes`` (413) or slower than ``body_timeout`` (408) as they
    stream in; a response to a request whose body was not read closes the connection."""

    def __init__(self, app: Any, limits: GatewayLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limits.max_body_bytes
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _send_error(send, body_too_large(limit))
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.body_timeout
        received = 0
        body_done = False

        async def limited_receive() -> dict[str, Any]:
            nonlocal received, body_done
            if body_done:
                return await receive()  # a streaming response listening for the disconnect
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise GatewayError(
                    408,
                    f"the request body did not arrive within {self.limits.body_timeout} s "
                    "(AGENTGYM_LIGHTNING_GATEWAY_BODY_TIMEOUT)",
                    code="request_timeout",
                ) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise body_too_large(limit)
                body_done = not message.get("more_body", False)
            else:
                body_done = True
            return message

        async def closing_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and not body_done:
                # The rest of the body is unread: this connection cannot carry another request.
                message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        await self.app(scope, limited_receive, closing_send)


async def _send_error(send: Any, exc: GatewayError) -> None:
    body = json.dumps(error_body(exc.status, exc.message, exc.code)).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        *((k.encode(), v.encode()) for k, v in ERROR_HEADERS.items()),
    ]
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
