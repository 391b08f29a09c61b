"""The HTTP transports of :class:`~agentgym_lightning.policies.openai.OpenAIPolicy`, on kept
client libraries.

* :class:`AiohttpTransport` — aiohttp, for every real upstream (``http://`` and ``https://``,
  proxies from the environment): a batch's requests all go out at once from the policy's event
  loop, one keep-alive connection each, no pool cap. aiohttp's connector does constant work per
  request however many connections it holds (httpx's async pool scans all of them, twice nested,
  on every request: ~100 ms a call at hundreds of connections).
* :class:`SyncHTTP` — the standard library's ``http.client``, for a batch of one: the request
  goes out from the caller's thread (handing it to the I/O thread and back would be most of a small request's
  latency). ``bench/bench_openai_transport.py`` measures what it adds over a bare socket.
* :class:`HttpxTransport` — httpx's async client over an injected transport (tests), spread
  over small pools of :data:`POOL_SHARD_SIZE` connections.

None bounds concurrency itself: the policy hands each request a *slot* (``0 <= slot <
concurrency``) and never has more than ``concurrency`` requests out. All raise
:class:`TransportFailure` for anything that is not an HTTP response (connection refused or
reset, time-outs, malformed responses): the policy retries those, or fails over to another
replica.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx

from agentgym_lightning.policies.served_weights import VERSION_HEADER

__all__ = [
    "TransportFailure",
    "AiohttpTransport",
    "SyncHTTP",
    "HttpxTransport",
    "POOL_SHARD_SIZE",
    "KEPT_HEADERS",
    "Response",
    "pick_transport",
    "env_proxy",
]

#: Connections per httpx pool (the injected-transport path opens one pool per this many slots).
POOL_SHARD_SIZE = 16

#: (status, lower-cased headers the policy reads, body)
Response = tuple[int, dict[str, str], bytes]


class TransportFailure(Exception):
    """No HTTP response: the connection failed, timed out, or the answer was not HTTP."""


#: The response headers the policy reads: Retry-After, and the weights version a generator server
#: stamps on its answers (:mod:`~agentgym_lightning.policies.served_weights`).
KEPT_HEADERS = ("retry-after", VERSION_HEADER)


def _headers_of_interest(headers: Mapping[str, str]) -> dict[str, str]:
    # Only these are read; copying every header costs more than the rest.
    return {name: value for name in KEPT_HEADERS if (value := headers.get(name)) is not None}


class AiohttpTransport:
    """aiohttp to one upstream; the session is made on first use, on the policy's loop."""

    def __init__(
        self, base_url: str, headers: Mapping[str, str], *, timeout: float | None, connect_timeout: float | None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = {"accept": "application/json", "user-agent": "agentgym-lightning", **headers}
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        # Resolved once: aiohttp's trust_env reads the environment on every request.
        self.proxy = env_proxy(base_url)
        self._session: Any = None

    def _make_session(self) -> Any:
        import aiohttp

        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=60.0, ttl_dns_cache=300)
        return aiohttp.ClientSession(
            connector=connector,
            headers=self.headers,
            timeout=aiohttp.ClientTimeout(total=self.timeout, sock_connect=self.connect_timeout),
        )

    async def request(self, slot: int, method: str, path: str, content: bytes | None) -> Response:
        import aiohttp

        del slot  # the connector hands out any idle connection
        if self._session is None:
            self._session = self._make_session()
        url = self.base_url + path
        for attempt in (1, 2):
            try:
                async with self._session.request(method, url, data=content, proxy=self.proxy) as response:
                    body = await response.read()
                    return response.status, _headers_of_interest(response.headers), body
            except aiohttp.ServerDisconnectedError as exc:
                # An idle keep-alive connection the server closed as we reused it: nothing was
                # processed, so send once more on a fresh one.
                if attempt == 2:
                    raise TransportFailure(f"ServerDisconnectedError: {exc}") from exc
            except TimeoutError as exc:
                raise TransportFailure(f"no response within {self.timeout} s") from exc
            except aiohttp.ClientError as exc:
                raise TransportFailure(f"{type(exc).__name__}: {exc or 'no detail'}") from exc
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()


class SyncHTTP:
    """The standard library's ``http.client`` to one upstream, for requests sent from the
    caller's thread. Thread-safe; keep-alive connections pooled LIFO (the policy bounds how many
    requests are out). ``http.client`` rather than httpx or urllib3 here: on this project's
    2-core CI box a request costs ~0.3 ms of CPU with it, ~0.55 ms with urllib3 and ~0.8 ms with
    httpx's blocking client, and this path is a lone agent's latency (see
    ``bench/bench_openai_transport.py``)."""

    def __init__(
        self,
        base_url: str,
        headers: Mapping[str, str],
        *,
        timeout: float | None,
        connect_timeout: float | None,
    ) -> None:
        import http.client
        import ssl

        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"SyncHTTP needs an http:// or https:// URL, got {base_url!r}")
        self.base_path = parts.path.rstrip("/")
        self.headers = {"accept": "application/json", "user-agent": "agentgym-lightning", **headers}
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        if parts.scheme == "https":
            context = ssl.create_default_context()
            self._connect = lambda: http.client.HTTPSConnection(
                parts.hostname, parts.port, timeout=connect_timeout, context=context
            )
        else:
            self._connect = lambda: http.client.HTTPConnection(parts.hostname, parts.port, timeout=connect_timeout)
        self._errors = (OSError, http.client.HTTPException)
        self._stale = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)
        self._idle: deque[Any] = deque()
        self._lock = threading.Lock()

    def _acquire(self) -> tuple[Any, bool]:
        with self._lock:
            if self._idle:
                return self._idle.pop(), True  # LIFO: the warmest connection
        conn = self._connect()
        conn.connect()
        conn.sock.settimeout(self.timeout)  # connect_timeout was for connecting only
        return conn, False

    def request(self, method: str, path: str, content: bytes | None) -> Response:
        for attempt in (1, 2):
            conn = None
            try:
                conn, reused = self._acquire()
                conn.request(method, self.base_path + path, body=content, headers=self.headers)
                response = conn.getresponse()
                body = response.read()
            except self._stale as exc:
                if conn is not None:
                    conn.close()
                if reused and attempt == 1:
                    continue  # an idle keep-alive connection the server had dropped: send again
                raise TransportFailure(f"{type(exc).__name__}: {exc or 'connection closed'}") from exc
            except TimeoutError as exc:
                if conn is not None:
                    conn.close()
                raise TransportFailure(f"no response within {self.timeout} s ({exc})") from exc
            except self._errors as exc:  # refused, reset, not HTTP...
                if conn is not None:
                    conn.close()
                raise TransportFailure(f"{type(exc).__name__}: {exc or 'no detail'}") from exc
            if response.will_close:
                conn.close()
            else:
                with self._lock:
                    self._idle.append(conn)
            return response.status, _headers_of_interest(response.headers), body
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            while self._idle:
                self._idle.pop().close()


class HttpxTransport:
    """httpx's async client over an injected transport (``httpx.MockTransport`` in tests),
    spread over one small pool per :data:`POOL_SHARD_SIZE` slots (created lazily)."""

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
        return response.status_code, _headers_of_interest(response.headers), response.content

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
) -> AiohttpTransport | HttpxTransport:
    """:class:`HttpxTransport` over an injected ``transport``, else :class:`AiohttpTransport`."""
    if transport is not None:
        return HttpxTransport(
            base_url, headers, concurrency=concurrency, timeout=timeout, connect_timeout=connect_timeout, transport=transport
        )
    if urlsplit(base_url).scheme not in ("http", "https"):
        raise ValueError(f"the openai backend needs an http:// or https:// base URL, got {base_url!r}")
    return AiohttpTransport(base_url, headers, timeout=timeout, connect_timeout=connect_timeout)


def env_proxy(base_url: str) -> str | None:
    """The proxy the environment (``HTTP_PROXY``, ``HTTPS_PROXY``, ``NO_PROXY``) routes
    ``base_url`` through, or None."""
    import urllib.request

    parts = urlsplit(base_url)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if not proxy or not parts.hostname or urllib.request.proxy_bypass(parts.hostname):
        return None
    return proxy
