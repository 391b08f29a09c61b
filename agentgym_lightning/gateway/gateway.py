"""The interception gateway: its router (:mod:`.router`) plus what agents reach it through.

One gateway serves every episode of the process. Agents reach it two ways, with the same
semantics: in-process through an httpx transport (no socket, see :mod:`.transport`), or over
HTTP at ``http://127.0.0.1:<port>/episodes/<id>/v1`` (see :mod:`.app`; the server starts on first
use), which is also how an agent in another process or on another machine takes part
(Training-Agent Disaggregation). It also keeps the event loop ``async def`` agents share and the
agent workers that outlived their episodes (:mod:`agentgym_lightning.worker`).
"""

from __future__ import annotations

import os
import ssl
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from agentgym_lightning.gateway.auth import server_token
from agentgym_lightning.background_loop import BackgroundLoop
from agentgym_lightning.gateway.limits import GatewayLimits
from agentgym_lightning.gateway.router import EpisodeRouter
from agentgym_lightning.gateway.server import GatewayServer
from agentgym_lightning.gateway.transport import AsyncInProcessTransport, InProcessTransport

__all__ = ["Gateway", "get_gateway", "INPROC_HOST", "LingeringAgent"]

#: Host name of in-process base URLs; never resolved, the transport answers it directly.
INPROC_HOST = "agentgym.inproc"
HOST_ENV = "AGENTGYM_LIGHTNING_GATEWAY_HOST"
PORT_ENV = "AGENTGYM_LIGHTNING_GATEWAY_PORT"
TOKEN_ENV = "AGENTGYM_LIGHTNING_GATEWAY_TOKEN"


@dataclass(frozen=True)
class LingeringAgent:
    """An agent worker (thread, or async task's future) still running after its episode ended."""

    episode_id: str
    worker: Any
    #: Where it was blocked when its episode stopped it.
    where: str
    since: float

    @property
    def alive(self) -> bool:
        is_alive = getattr(self.worker, "is_alive", None)
        return is_alive() if is_alive is not None else not self.worker.done()


_ssl_context: ssl.SSLContext | None = None
_ssl_lock = threading.Lock()


def _default_ssl_context() -> ssl.SSLContext:
    # Shared by every client: an SSLContext is safe to use from many threads, and its defaults
    # (the system's CA store, hostname checks) are the same for all of them. Under the lock, the
    # episodes' agents that start at once build one, not one each.
    global _ssl_context
    with _ssl_lock:
        if _ssl_context is None:
            _ssl_context = ssl.create_default_context()
        return _ssl_context


class Gateway(EpisodeRouter):
    """The episode router (registry, auth, requests) plus the OpenAI-compatible endpoint in
    front of it: the HTTP server, in-process clients, and the loop ``async def`` agents run on.

    Args:
        host: Address the HTTP server binds when first needed. ``127.0.0.1`` by default; any
            non-loopback address requires a bearer token.
        port: Port to bind (0 picks a free one).
        token: Bearer token clients must send. Required off loopback: if none is given there,
            one is generated (read it from :attr:`api_key`). On loopback, a token is checked only
            when given.
        limits: Bounds on request sizes, timeouts and connections (see
            :class:`~agentgym_lightning.gateway.limits.GatewayLimits` and ``docs/limits.md``).
        extra_routes: More Starlette routes for its HTTP server (the standalone gateway's
            episode API, :mod:`.standalone`); they are matched first and should check the token
            with :meth:`check_auth`.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        limits: GatewayLimits | None = None,
        extra_routes: Sequence[Any] = (),
    ) -> None:
        super().__init__(token=server_token(host, token), limits=limits)
        self.host = host
        self.port = port
        self.extra_routes = list(extra_routes)
        self._lingering: list[LingeringAgent] = []
        self._server: GatewayServer | None = None
        self._loop: BackgroundLoop | None = None

    # ------------------------------------------------------------------ workers that outlive episodes

    def add_lingering(self, episode_id: str, worker: Any, where: str) -> None:
        """Record an agent worker that did not stop with its episode (see :meth:`AgentWorker.stop`)."""
        with self._lock:
            self._lingering.append(LingeringAgent(episode_id, worker, where, time.time()))

    def lingering_agents(self) -> list[LingeringAgent]:
        """Agent workers still running although their episodes ended (each blocked in a call
        Python cannot interrupt); ended ones are forgotten."""
        with self._lock:
            self._lingering = [a for a in self._lingering if a.alive]
            return list(self._lingering)

    def check_lingering(self) -> None:
        """Refuse to start another episode while ``max_lingering_agents`` workers outlive theirs."""
        lingering = self.lingering_agents()
        if len(lingering) >= self.limits.max_lingering_agents:
            raise RuntimeError(
                f"{len(lingering)} agent workers outlived their episodes, each blocked in a call Python cannot "
                f"interrupt (first: episode {lingering[0].episode_id}, {lingering[0].where}); give the agent's "
                "blocking calls timeouts, or raise GatewayLimits.max_lingering_agents "
                "(AGENTGYM_LIGHTNING_GATEWAY_MAX_LINGERING_AGENTS)"
            )

    # ------------------------------------------------------------------ episodes

    def unregister(self, episode_id: str) -> None:
        """Forget the episode (its requests are answered 404 from now on) and close the HTTP
        connections only its clients used: an agent's own client, never closed, must not keep
        sockets open after its episode (see :mod:`.connections`)."""
        super().unregister(episode_id)
        server = self._server
        if server is not None:
            server.end_episode(episode_id)

    # ------------------------------------------------------------------ endpoints

    def start(self) -> None:
        """Start the HTTP server now (it otherwise starts on first use of :meth:`base_url`)."""
        if self._server is None:
            with self._lock:
                if self._server is None:
                    server = GatewayServer(self, self.host, self.port, self.limits, self.extra_routes)
                    server.start()
                    self.port = server.port
                    self._server = server

    @property
    def url(self) -> str:
        """The server's root URL (starts it if needed)."""
        self.start()
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def base_url(self, episode_id: str) -> str:
        """An episode's OpenAI base URL over HTTP."""
        return f"{self.url}/episodes/{episode_id}/v1"

    def anthropic_base_url(self, episode_id: str) -> str:
        """An episode's base URL for Anthropic clients, over HTTP: without ``/v1``, which they add
        themselves (``/v1/messages``)."""
        return self.base_url(episode_id).removesuffix("/v1")

    def client_base_url(self, episode_id: str, transport: str) -> str:
        if transport == "inproc":
            return f"http://{INPROC_HOST}/episodes/{episode_id}/v1"
        return self.base_url(episode_id)

    @property
    def api_key(self) -> str:
        return self.token or "agentgym-lightning"

    @property
    def ssl_context(self) -> ssl.SSLContext:
        """One SSL context for every client the process makes: building one loads the CA store
        (tens of ms), which would otherwise be paid per agent even for plain-HTTP gateways, and
        once per agent that asked while none was built yet (the main job's episodes start at once)."""
        return _default_ssl_context()

    def http_client(self, transport: str) -> httpx.Client:
        """A new httpx client for an agent: in-process (no socket) or over HTTP.

        Never shared between agents: a client holds locks (its cookie jar's, its pool's), and an
        agent stopped by force while holding one must not freeze every other agent.
        """
        if transport == "inproc":
            return httpx.Client(transport=InProcessTransport(self), timeout=None, trust_env=False, verify=self.ssl_context)
        # One client (one pool) per agent: httpx's pool does work that grows with its size on every
        # request, so a single pool shared by hundreds of agents is far slower. Construction is
        # cheap because every client reuses one SSL context.
        return httpx.Client(
            timeout=None,
            trust_env=False,
            verify=self.ssl_context,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        )

    def async_http_client(self, transport: str) -> httpx.AsyncClient:
        """A new async client (async clients are bound to the event loop that uses them)."""
        if transport == "inproc":
            return httpx.AsyncClient(
                transport=AsyncInProcessTransport(self), timeout=None, trust_env=False, verify=self.ssl_context
            )
        return httpx.AsyncClient(
            timeout=None,
            trust_env=False,
            verify=self.ssl_context,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        )

    def background_loop(self) -> BackgroundLoop:
        """The event loop ``async def`` agents run on."""
        if self._loop is None:
            with self._lock:
                if self._loop is None:
                    self._loop = BackgroundLoop(name="agentgym-agents")
        return self._loop

    def close(self) -> None:
        """Stop the server and the agents' loop (episodes should be closed first)."""
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._loop is not None:
            self._loop.close()
            self._loop = None


_default: Gateway | None = None
_default_lock = threading.Lock()


def get_gateway() -> Gateway:
    """The process-wide gateway, configured from ``AGENTGYM_LIGHTNING_GATEWAY_HOST`` / ``_PORT`` /
    ``_TOKEN`` (defaults: 127.0.0.1, a free port, no token) and the limits'
    ``AGENTGYM_LIGHTNING_GATEWAY_<LIMIT>`` variables (:meth:`GatewayLimits.from_env`)."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Gateway(
                    host=os.environ.get(HOST_ENV, "127.0.0.1"),
                    port=int(os.environ.get(PORT_ENV, "0")),
                    token=os.environ.get(TOKEN_ENV) or None,
                    limits=GatewayLimits.from_env(),
                )
    return _default


def _forget_default_after_fork() -> None:
    # A forked child (an async vector env's worker) has none of the parent's threads: not its
    # server, not its event loop. It builds a gateway of its own on first use.
    global _default, _default_lock
    _default = None
    _default_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_default_after_fork)
