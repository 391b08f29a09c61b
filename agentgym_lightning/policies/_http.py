"""The two HTTP transports of :class:`~agentgym_lightning.policies.openai_server.OpenAIPolicy`.

* :class:`FastHTTP` — a lean HTTP/1.1 keep-alive client on asyncio streams, for ``http://``
  upstreams (a local ``vllm serve``, an inference server on the cluster network). One request
  per connection at a time, connections opened on demand and reused LIFO, responses with
  ``Content-Length``, ``Transfer-Encoding: chunked`` or read-to-close. It costs ~0.1 ms of CPU a
  request where httpx's async stack costs several ms under load (and httpx's pool bookkeeping
  grows with the square of its size), which is what lets one policy keep hundreds of requests
  in flight without becoming the bottleneck.
* :class:`HttpxTransport` — httpx, for ``https://``, proxies and injected test transports;
  spread over small pools of :data:`POOL_SHARD_SIZE` connections, one per shard of slots.

Both bound nothing themselves: the policy hands each request a *slot* (``0 <= slot <
concurrency``) and never has more than ``concurrency`` requests out. Both raise
:class:`TransportFailure` for anything that is not an HTTP response (connection refused or
reset, time-outs, malformed responses): the policy retries those.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx

__all__ = ["TransportFailure", "FastHTTP", "HttpxTransport", "POOL_SHARD_SIZE", "Response"]

#: Connections per httpx pool (the httpx transport opens one pool per this many slots).
POOL_SHARD_SIZE = 16

#: (status, lower-cased headers, body)
Response = tuple[int, dict[str, str], bytes]

_MAX_HEADER_BYTES = 1 << 20


class TransportFailure(Exception):
    """No HTTP response: the connection failed, timed out, or the answer was not HTTP."""


class FastHTTP:
    """HTTP/1.1 over asyncio streams to one ``http://host:port`` origin, keep-alive pooled."""

    def __init__(
        self, base_url: str, headers: Mapping[str, str], *, timeout: float | None, connect_timeout: float | None
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"FastHTTP needs an http:// URL, got {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.base_path = parts.path.rstrip("/")
        self.query = parts.query
        host_header = f"[{self.host}]" if ":" in self.host else self.host
        if parts.port:
            host_header += f":{parts.port}"
        fixed = {"host": host_header, "accept": "application/json", "user-agent": "agentgym-lightning", **headers}
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in fixed.items()).encode("latin-1")
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._idle: deque[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = deque()
        self.connections_opened = 0

    async def request(self, slot: int, method: str, path: str, content: bytes | None) -> Response:
        del slot  # any idle connection will do
        target = self.base_path + path + (f"?{self.query}" if self.query else "")
        head = f"{method} {target} HTTP/1.1\r\n".encode("latin-1") + self._fixed
        head += b"content-length: %d\r\n\r\n" % len(content or b"")
        payload = head + (content or b"")
        try:
            async with asyncio.timeout(self.timeout):
                while True:
                    conn, reused = await self._acquire()
                    try:
                        response, keep = await self._exchange(conn, payload, method)
                    except (asyncio.IncompleteReadError, ConnectionError) as exc:
                        _close(conn)
                        if reused and not getattr(exc, "partial", b""):
                            # The server closed an idle keep-alive connection before reading our
                            # request: nothing was processed, so send it again on a fresh one.
                            continue
                        raise
                    except BaseException:
                        _close(conn)
                        raise
                    if keep:
                        self._idle.append(conn)
                    else:
                        _close(conn)
                    return response
        except TimeoutError as exc:
            raise TransportFailure(f"no response within {self.timeout} s") from exc
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            raise TransportFailure(f"{type(exc).__name__}: {exc or 'connection closed'}") from exc

    async def _acquire(self) -> tuple[tuple[asyncio.StreamReader, asyncio.StreamWriter], bool]:
        while self._idle:
            conn = self._idle.pop()  # LIFO: the warmest connection
            if not conn[0].at_eof() and not conn[1].is_closing():
                return conn, True
            _close(conn)
        try:
            async with asyncio.timeout(self.connect_timeout):
                conn = await asyncio.open_connection(self.host, self.port, limit=_MAX_HEADER_BYTES)
        except TimeoutError as exc:
            raise TransportFailure(f"could not connect to {self.host}:{self.port} within {self.connect_timeout} s") from exc
        self.connections_opened += 1
        return conn, False

    async def _exchange(
        self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], payload: bytes, method: str
    ) -> tuple[Response, bool]:
        reader, writer = conn
        writer.write(payload)
        await writer.drain()
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            status, headers = _parse_head(head)
            if 100 <= status < 200 and status != 101:
                continue  # interim response (100 Continue...): the real one follows
            break
        keep = headers.get("connection", "").lower() != "close"
        if method == "HEAD" or status in (204, 304):
            return (status, headers, b""), keep
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = await _read_chunked(reader)
        elif "content-length" in headers:
            length = int(headers["content-length"])
            if length < 0:
                raise ValueError(f"negative content-length {length}")
            body = await reader.readexactly(length)
        else:
            body = await reader.read()  # delimited by the server closing the connection
            keep = False
        return (status, headers, body), keep

    async def aclose(self) -> None:
        while self._idle:
            _close(self._idle.pop())


def _close(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
    with contextlib.suppress(Exception):
        conn[1].close()


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    status_line = lines[0].split(" ", 2)
    if len(status_line) < 2 or not status_line[0].startswith("HTTP/"):
        raise ValueError(f"not an HTTP response: {lines[0][:100]!r}")
    status = int(status_line[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"malformed header line {line[:100]!r}")
        key = name.strip().lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return status, headers


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers, then the blank line
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)  # the CRLF after each chunk


class HttpxTransport:
    """httpx, spread over one small pool per :data:`POOL_SHARD_SIZE` slots (created lazily).

    httpx's pool scans all its connections (twice nested) on every request, so one pool of
    hundreds of connections costs ~100 ms a call; small pools keep that flat.
    """

    def __init__(
        self,
        base_url: str,
        headers: Mapping[str, str],
        *,
        concurrency: int,
        timeout: float | None,
        connect_timeout: float | None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url
        self.headers = dict(headers)
        self.timeout = httpx.Timeout(timeout, connect=connect_timeout, pool=None)
        self.transport = transport
        self._shards: list[httpx.AsyncClient | None] = [None] * -(-concurrency // POOL_SHARD_SIZE)

    def _client(self, slot: int) -> httpx.AsyncClient:
        shard = slot // POOL_SHARD_SIZE
        client = self._shards[shard]
        if client is None:
            client = self._shards[shard] = httpx.AsyncClient(
                base_url=self.base_url,
                headers=self.headers,
                timeout=self.timeout,
                limits=httpx.Limits(
                    max_connections=POOL_SHARD_SIZE, max_keepalive_connections=POOL_SHARD_SIZE, keepalive_expiry=60.0
                ),
                transport=self.transport,
                trust_env=self.transport is None,
            )
        return client

    async def request(self, slot: int, method: str, path: str, content: bytes | None) -> Response:
        try:
            response = await self._client(slot).request(method, self.base_url + path, content=content)
        except httpx.TransportError as exc:  # connect/read/write errors and time-outs
            raise TransportFailure(f"{type(exc).__name__}: {exc or 'no detail'}") from exc
        return response.status_code, {k.lower(): v for k, v in response.headers.items()}, response.content

    async def aclose(self) -> None:
        clients = [c for c in self._shards if c is not None]
        self._shards = [None] * len(self._shards)
        await asyncio.gather(*(c.aclose() for c in clients), return_exceptions=True)


def pick_transport(
    base_url: str,
    headers: Mapping[str, str],
    *,
    concurrency: int,
    timeout: float | None,
    connect_timeout: float | None,
    transport: httpx.AsyncBaseTransport | None = None,
    fast: bool = True,
) -> Any:
    """:class:`FastHTTP` for plain ``http://`` with no proxy in the way, else :class:`HttpxTransport`."""
    parts = urlsplit(base_url)
    if fast and transport is None and parts.scheme == "http" and parts.hostname and not _proxied(parts.hostname):
        return FastHTTP(base_url, headers, timeout=timeout, connect_timeout=connect_timeout)
    return HttpxTransport(
        base_url, headers, concurrency=concurrency, timeout=timeout, connect_timeout=connect_timeout, transport=transport
    )


def _proxied(host: str) -> bool:
    """Whether the environment routes plain-HTTP traffic to ``host`` through a proxy."""
    import urllib.request

    proxies = urllib.request.getproxies()
    if not proxies.get("http"):
        return False
    return not urllib.request.proxy_bypass(host)


class SyncHTTP:
    """Blocking HTTP/1.1 keep-alive client to one ``http://host:port`` origin, for callers that
    send one request at a time: it runs in the caller's thread (no hand-off to an I/O thread,
    which is most of a small request's latency). Thread-safe; connections are pooled LIFO."""

    def __init__(
        self, base_url: str, headers: Mapping[str, str], *, timeout: float | None, connect_timeout: float | None
    ) -> None:
        import threading

        self._template = FastHTTP(base_url, headers, timeout=timeout, connect_timeout=connect_timeout)
        self._idle: deque[Any] = deque()
        self._lock = threading.Lock()
        self.connections_opened = 0

    def request(self, method: str, path: str, content: bytes | None) -> Response:
        t = self._template
        target = t.base_path + path + (f"?{t.query}" if t.query else "")
        payload = f"{method} {target} HTTP/1.1\r\n".encode("latin-1") + t._fixed
        payload += b"content-length: %d\r\n\r\n" % len(content or b"") + (content or b"")
        try:
            while True:
                conn, reused = self._acquire()
                try:
                    response, keep = self._exchange(conn, payload, method)
                except (ConnectionError, _Incomplete) as exc:
                    _close_sync(conn)
                    if reused and not getattr(exc, "partial", b""):
                        continue  # an idle keep-alive connection the server had dropped
                    raise
                except BaseException:
                    _close_sync(conn)
                    raise
                if keep:
                    with self._lock:
                        self._idle.append(conn)
                else:
                    _close_sync(conn)
                return response
        except TimeoutError as exc:
            raise TransportFailure(f"no response within {t.timeout} s") from exc
        except (OSError, _Incomplete, ValueError) as exc:
            raise TransportFailure(f"{type(exc).__name__}: {exc or 'connection closed'}") from exc

    def _acquire(self) -> tuple[Any, bool]:
        import select
        import socket

        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                break
            # An idle connection with something to read has been closed (or broken) by the server.
            if not select.select([conn[0]], [], [], 0)[0]:
                return conn, True
            _close_sync(conn)
        t = self._template
        sock = socket.create_connection((t.host, t.port), timeout=t.connect_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(t.timeout)
        self.connections_opened += 1
        return (sock, sock.makefile("rb")), False

    @staticmethod
    def _exchange(conn: Any, payload: bytes, method: str) -> tuple[Response, bool]:
        sock, rfile = conn
        sock.sendall(payload)
        while True:
            head = b""
            while True:
                line = rfile.readline(_MAX_HEADER_BYTES)
                if not line:
                    raise _Incomplete(head)
                head += line
                if line in (b"\r\n", b"\n") and len(head) > len(line):
                    break
                if len(head) > _MAX_HEADER_BYTES:
                    raise ValueError("response headers too large")
            status, headers = _parse_head(head)
            if not (100 <= status < 200 and status != 101):
                break
        keep = headers.get("connection", "").lower() != "close"
        if method == "HEAD" or status in (204, 304):
            return (status, headers, b""), keep
        if "chunked" in headers.get("transfer-encoding", "").lower():
            parts = []
            while True:
                size = int(rfile.readline(_MAX_HEADER_BYTES).split(b";", 1)[0].strip() or b"x", 16)
                if size == 0:
                    while rfile.readline(_MAX_HEADER_BYTES) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                parts.append(_read_exact(rfile, size))
                _read_exact(rfile, 2)
            body = b"".join(parts)
        elif "content-length" in headers:
            body = _read_exact(rfile, int(headers["content-length"]))
        else:
            body = rfile.read()
            keep = False
        return (status, headers, body), keep

    def close(self) -> None:
        with self._lock:
            while self._idle:
                _close_sync(self._idle.pop())


class _Incomplete(Exception):
    def __init__(self, partial: bytes) -> None:
        super().__init__(f"connection closed after {len(partial)} bytes")
        self.partial = partial


def _read_exact(rfile: Any, n: int) -> bytes:
    data = rfile.read(n)
    if len(data) != n:
        raise _Incomplete(data)
    return data


def _close_sync(conn: Any) -> None:
    with contextlib.suppress(Exception):
        conn[1].close()
    with contextlib.suppress(Exception):
        conn[0].close()
