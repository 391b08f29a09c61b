"""One episode's endpoint: what its agent is handed to reach the gateway.

Its base URL (over HTTP, or in-process with no socket), the key to send, the HTTP clients made
for it (closed when the episode ends), and the native call path with no client at all.
:class:`~agentgym_lightning.agent.AgentContext` talks to this; the episode's record
(:class:`~agentgym_lightning.episode.Episode`) knows nothing of URLs or sockets.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any, Literal

import httpx

from agentgym_lightning.episode import Episode, PendingCall
from agentgym_lightning.background_loop import BackgroundLoop
from agentgym_lightning.gateway.gateway import Gateway

__all__ = ["EpisodeEndpoint", "Transport"]

log = logging.getLogger(__name__)

#: How an episode's ready-made clients reach the gateway: ``"inproc"`` (an httpx transport
#: calling the router directly, no socket) or ``"http"`` (a real socket to the gateway's server).
Transport = Literal["inproc", "http"]


class EpisodeEndpoint:
    """Where one episode's agent reaches ``gateway``.

    Args:
        gateway: The gateway the episode is registered with (by :meth:`open`).
        episode: The episode's record.
        transport: How the clients made here reach the gateway (see :data:`Transport`).
    """

    def __init__(self, gateway: Gateway, episode: Episode, transport: Transport = "inproc") -> None:
        self.gateway = gateway
        self.episode = episode
        self.transport = transport
        self._lock = threading.Lock()
        self._clients: list[httpx.Client | httpx.AsyncClient] = []

    @property
    def episode_id(self) -> str:
        return self.episode.episode_id

    def open(self) -> None:
        """Register the episode with the gateway: its agent's requests are routed to it from now on."""
        self.gateway.register(self.episode)

    def close(self) -> None:
        """Unregister the episode: a request for it is answered 404 from now on."""
        self.gateway.unregister(self.episode_id)

    # ------------------------------------------------------------------ addresses

    @property
    def base_url(self) -> str:
        """The episode's OpenAI base URL over HTTP (starts the gateway's server if needed)."""
        return self.gateway.base_url(self.episode_id)

    @property
    def client_base_url(self) -> str:
        """The base URL the clients made here use: in-process it needs no server."""
        return self.gateway.client_base_url(self.episode_id, self.transport)

    @property
    def anthropic_base_url(self) -> str:
        """The episode's base URL for Anthropic clients over HTTP (no ``/v1``: they add it)."""
        return self.gateway.anthropic_base_url(self.episode_id)

    @property
    def api_key(self) -> str:
        """The key to send (the gateway's bearer token; any value works without one)."""
        return self.gateway.api_key

    # ------------------------------------------------------------------ calls

    def submit(self, body: Mapping[str, Any]) -> PendingCall:
        """Make one chat-completion call with no HTTP client: checked and routed as any request."""
        return self.gateway.submit(self.episode_id, body)

    def http_client(self) -> httpx.Client:
        """A new httpx client for the agent (see :meth:`Gateway.http_client`); closed by
        :meth:`close_clients`."""
        client = self.gateway.http_client(self.transport)
        # Over HTTP the refusal comes back as a response: the worker's guard raises at that clean point too.
        client.event_hooks["response"].append(self.episode.raise_if_stopped)
        self._remember(client)
        return client

    def async_http_client(self) -> httpx.AsyncClient:
        """A new async httpx client for the agent (``async def`` agents); closed by :meth:`close_clients`."""
        client = self.gateway.async_http_client(self.transport)
        if self.transport != "inproc":
            self._remember(client)
        return client

    def _remember(self, client: httpx.Client | httpx.AsyncClient) -> None:
        with self._lock:
            self._clients.append(client)

    def close_clients(self, loop: BackgroundLoop | None = None) -> None:
        """Close the agent's HTTP clients now: their sockets must not wait for the garbage
        collector. Async clients used on ``loop`` are closed there."""
        with self._lock:
            clients, self._clients = self._clients, []
        for client in clients:
            try:
                if isinstance(client, httpx.AsyncClient):
                    if loop is not None:
                        loop.submit(client.aclose()).result(1.0)
                else:
                    client.close()
            except Exception:  # noqa: BLE001 - best effort: the agent may still be using it
                log.debug("closing an HTTP client of episode %s failed", self.episode_id, exc_info=True)

    def drop_clients(self) -> None:
        """Forget the clients without closing them (a worker still running may hold their
        locks); their sockets close when they are collected."""
        with self._lock:
            self._clients.clear()
