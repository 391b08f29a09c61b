"""Where the HTTP server enforces :class:`~agentgym_lightning.gateway.limits.GatewayLimits`.

uvicorn has a knob for keep-alive idleness (``timeout_keep_alive``, which we set) but none for the
size or the time of a request's head and body, nor a cap that keeps sockets from using up file
descriptors (``limit_concurrency`` answers 503 only *after* accepting and parsing a request, so
idle sockets still hold descriptors). :class:`LimitedHttpToolsProtocol` is uvicorn's own
httptools protocol plus exactly those, counted as bytes arrive:

- the head must arrive within ``header_timeout`` and ``max_header_bytes`` (httptools would
  otherwise buffer a 10 MB header whole);
- the body must stay within ``max_body_bytes`` (a larger ``Content-Length`` is refused before any
  of it is read; uvicorn reads a body only as fast as the app consumes it, so at most one read
  more is buffered) and arrive within ``body_timeout``;
- the bodies still arriving on all connections together stay within ``max_receiving_body_bytes``
  (:class:`ReceivingBodies`): past it, the body that began arriving first is refused, so slow
  senders cannot hold ``max_body_bytes`` each on every connection;
- a response the client does not read for ``send_timeout`` (its socket's buffers full) drops the
  connection, so a client that stops reading holds neither its connection nor the unsent bytes;
- at ``max_connections`` the connection waiting longest for a request is closed;
- malformed HTTP gets an OpenAI-shaped 400, not uvicorn's plain text;
- an Upgrade we do not speak (h2c) is served as plain HTTP/1.1, or refused if it has a body
  (httptools stops at an upgrading head, so the body would be silently lost).

A refusal answers in the error shape of the wire its path is routed to (OpenAI's; Anthropic's on
``/v1/messages``), after any responses owed to requests pipelined before it, and closes the
connection; the request never reaches (or, mid-body, is taken from) the app. Time a call spends waiting for its completion is never
counted against a connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from agentgym_lightning.gateway.limits import GatewayLimits
from agentgym_lightning.gateway.openai_wire import ERROR_HEADERS, GatewayError
from agentgym_lightning.gateway.routes import error_wire
from agentgym_lightning.gateway.validation import body_too_large

__all__ = ["LimitedHttpToolsProtocol", "ReceivingBodies"]

log = logging.getLogger(__name__)


def _error_bytes(status: int, message: str, code: str, path: str) -> bytes:
    """A complete HTTP/1.1 error response that closes the connection, in the error shape of the
    wire ``path`` is routed to (Anthropic's for ``/v1/messages``)."""
    body = json.dumps(error_wire(path).error_body(GatewayError(status, message, code))).encode()
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


class ReceivingBodies:
    """The request bodies still arriving on one server's connections (used on its event loop
    only): their bytes together, and the connections in the order their bodies began."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.total = 0
        self.receiving: dict[LimitedHttpToolsProtocol, None] = {}  # insertion order: the first body first

    def add(self, connection: LimitedHttpToolsProtocol, size: int) -> None:
        self.total += size
        self.receiving.setdefault(connection, None)

    def release(self, connection: LimitedHttpToolsProtocol, size: int) -> None:
        if self.receiving.pop(connection, False) is None:
            self.total -= size


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with size and time limits on heads and bodies, and a cap on
    connections (see the module docstring)."""

    _last_cap_warning = 0.0

    def __init__(self, *args: Any, limits: GatewayLimits, bodies: ReceivingBodies | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self.cap = limits.connection_cap()
        # Shared by the server's connections (ThreadedServer makes one per server).
        self.bodies = bodies if bodies is not None else ReceivingBodies(limits.receiving_body_cap())
        self._body_started = 0.0
        self._awaiting_head = True  # between requests, or reading a head
        self._head_bytes = 0  # bytes received since this head began (may include a little body)
        self._head_exact = 0  # the head's size as parsed
        self._in_body = False
        self._body_bytes = 0
        self._timer: asyncio.TimerHandle | None = None  # the head's or the body's deadline
        self._send_timer: asyncio.TimerHandle | None = None  # how long the client may leave a response unread
        self._completed_requests = 0
        self._waiting_since = time.monotonic()
        # A refusal of a pipelined request, held until the responses owed before it are sent.
        self._held_refusal: bytes | None = None
        self._owed_before_refusal = 0

    # ------------------------------------------------------------------ connections

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.limits.header_timeout)  # a socket that sends nothing is closed too
        if len(self.connections) > self.cap:
            self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        self.bodies.release(self, self._body_bytes)
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
        if self._held_refusal is not None:
            self._owed_before_refusal -= 1
            if self._owed_before_refusal <= 0 and not self.transport.is_closing():
                self._unset_keepalive_if_required()
                self.transport.write(self._held_refusal)
                self.transport.close()

    # ------------------------------------------------------------------ deadlines

    def pause_writing(self) -> None:
        # The transport's buffer is over its high-water mark: the client is not reading.
        super().pause_writing()
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.limits.send_timeout, self._not_reading)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def timeout_keep_alive_handler(self) -> None:
        if self.transport.get_write_buffer_size():
            # The last response is still unread: a close now would wait for the client to read
            # it, for ever if it never does; send_timeout drops it instead.
            if self._send_timer is None:
                self._send_timer = self.loop.call_later(self.limits.send_timeout, self._not_reading)
            return
        super().timeout_keep_alive_handler()

    def _not_reading(self) -> None:
        self._send_timer = None
        log.warning(
            "gateway: a client left a response unread for %s s (GatewayLimits.send_timeout): its connection is dropped",
            self.limits.send_timeout,
        )
        closing = self.transport.is_closing()
        self.transport.abort()  # close() would wait for the unread bytes to be sent
        if closing:  # seen with uvloop: a closing transport kept its connection after abort()
            with contextlib.suppress(OSError, AttributeError):
                self.transport.get_extra_info("socket").shutdown(socket.SHUT_RDWR)

    def _arm(self, seconds: float) -> None:
        if self._timer is None:
            self._timer = self.loop.call_later(seconds, self._timed_out)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        if self._in_body:
            self._refuse(_Refused(408, f"the request body did not arrive within {self.limits.body_timeout} s "
                                  "(AGENTGYM_LIGHTNING_GATEWAY_BODY_TIMEOUT)", "request_timeout"))
        elif self._head_bytes:
            self._refuse(_Refused(408, f"the request head did not arrive within {self.limits.header_timeout} s "
                                  "(AGENTGYM_LIGHTNING_GATEWAY_HEADER_TIMEOUT)", "request_timeout"))
        elif not self.transport.is_closing():
            self.transport.close()  # it never sent a byte: nobody to answer

    # ------------------------------------------------------------------ bytes in

    def data_received(self, data: bytes) -> None:
        # uvicorn's data_received, with parse errors answered in OpenAI's shape (and a refused
        # request not logged as "Invalid HTTP request"); no websockets on this server.
        if self._held_refusal is not None:
            return  # what follows a refused request is never read
        if self._awaiting_head:
            self._head_bytes += len(data)
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # An Upgrade we do not speak (h2c, websocket): the request is served as plain HTTP/1.1,
            # as a server may do (RFC 9110, 7.8), and the connection closed after its response,
            # because the parser reads nothing after an upgrade.
            if self.cycle is None or (self.cycle.response_complete and not self.pipeline):
                self.transport.close()
            else:
                self.cycle.keep_alive = False
            return
        except httptools.HttpParserError as exc:
            refusal = exc.__context__ if isinstance(exc.__context__, _Refused) else None
            self._refuse(refusal or _Refused(400, f"invalid HTTP request: {exc}", "invalid_request_error"))
            return
        if self._awaiting_head and self._head_bytes:
            if self._head_bytes > self.limits.max_header_bytes:
                self._refuse(_head_too_large(self.limits.max_header_bytes))
            else:
                # A head still arriving; on a kept-alive connection its clock starts now. Armed
                # only here, so a request whose head and body come in one read costs no timer.
                self._arm(self.limits.header_timeout)
        elif self._in_body:
            self._arm(self.limits.body_timeout)

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
        self._disarm()
        declared = next((v for k, v in self.headers if k == b"content-length"), b"")
        if declared.isdigit() and int(declared) > self.limits.max_body_bytes:
            raise _refusal(body_too_large(self.limits.max_body_bytes))  # before the app sees it
        if self.parser.should_upgrade() and (
            declared not in (b"", b"0") or any(k == b"transfer-encoding" for k, _ in self.headers)
        ):
            # httptools stops at the head of an Upgrade request: its body would never be read.
            raise _Refused(
                400,
                "an Upgrade request (h2c, websocket) with a body is not served here; send it without the "
                "Upgrade header (plain HTTP/1.1)",
                "invalid_request_error",
            )
        self._in_body = True
        self._body_bytes = 0
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._body_bytes:
            self._body_started = time.monotonic()
        self._body_bytes += len(body)
        if self._body_bytes > self.limits.max_body_bytes:
            raise _refusal(body_too_large(self.limits.max_body_bytes))
        self.bodies.add(self, len(body))
        while self.bodies.total > self.bodies.cap:
            # Slow senders would hold max_body_bytes each: the body that began first goes, so a
            # request sent at once gets in beside them (as at the connection cap).
            first = next(iter(self.bodies.receiving))
            refusal = first._too_many_bodies()
            if first is self:
                raise refusal
            first._refuse(refusal)
        super().on_body(body)

    def _too_many_bodies(self) -> _Refused:
        cap = self.bodies.cap
        return _Refused(
            408,
            f"the gateway is receiving more than {cap} bytes of request bodies at once and this one began arriving "
            f"first, {time.monotonic() - self._body_started:.1f} s ago, {self._body_bytes} bytes in: send a request's "
            "body without pausing, or raise max_receiving_body_bytes (AGENTGYM_LIGHTNING_GATEWAY_MAX_RECEIVING_BODY_BYTES)",
            "request_timeout",
        )

    def on_message_complete(self) -> None:
        self._in_body = False
        self._disarm()
        self.bodies.release(self, self._body_bytes)  # the app has it now
        super().on_message_complete()
        self._awaiting_head = True  # what follows on this connection is the next request's head

    def _refuse(self, refusal: _Refused) -> None:
        """Answer ``refusal`` and close the connection. Mid-body, the app reading that request
        sees the client gone, and if it has begun its own answer, ours is not sent. A refused
        request pipelined behind others is answered once their responses are sent."""
        self._disarm()
        self.bodies.release(self, self._body_bytes)  # freed with the request (the app sees the client gone)
        if self.transport.is_closing() or self._held_refusal is not None:
            return
        cycle = self.cycle if self._in_body else None  # the refused request's, if it reached the app
        queued = any(c is cycle for c, _ in self.pipeline)
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # its receive() returns http.disconnect, its send() nothing
            cycle.message_event.set()
        if queued:  # never started: it must not run once the requests before it are answered
            self.pipeline = type(self.pipeline)(entry for entry in self.pipeline if entry[0] is not cycle)
        started = cycle is not None and cycle.response_started
        path = getattr(self, "url", b"").split(b"?", 1)[0].decode("latin-1")  # the refused request's, as far as it arrived
        error = b"" if started else _error_bytes(refusal.status, refusal.message, refusal.code, path)
        # Responses still owed before this one: those queued before it, and the running one's.
        running = queued or bool(self.pipeline) or (
            cycle is None and self.cycle is not None and not self.cycle.response_complete
        )
        owed = len(self.pipeline) + running
        if owed:
            self._held_refusal, self._owed_before_refusal = error, owed
            self.flow.pause_reading()  # nothing after the refused request is read
        else:
            self.transport.write(error)
            self.transport.close()


def _refusal(exc: Any) -> _Refused:
    return _Refused(exc.status, exc.message, exc.code)


def _head_too_large(limit: int) -> _Refused:
    return _Refused(
        431,
        f"request head (request line and headers) is larger than {limit} bytes; send less, or raise the "
        "gateway's max_header_bytes (AGENTGYM_LIGHTNING_GATEWAY_MAX_HEADER_BYTES)",
        "request_header_fields_too_large",
    )
