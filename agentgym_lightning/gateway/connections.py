"""Which episode each HTTP connection to the gateway serves, so that an ended episode's
keep-alive connections are closed by the server when it ends.

An agent that builds its own client on its episode's base URL
(``openai.OpenAI(base_url=ctx.base_url)``, a framework's client) and never closes it keeps its
connection open after the episode, until the client is collected (LangChain's ``ChatOpenAI``
caches 128 clients) or the gateway's ``keep_alive_timeout`` passes: two sockets per episode when
the agent runs in this process, one on the gateway's side otherwise. A connection all of whose
requests went to one episode's base URL (``/episodes/<id>/v1/...``) can only ever be used for that
episode, whose requests are refused once it ends, so it is closed then: at once when it is idle,
with ``Connection: close`` on its response when a request is in flight; a request for it that
arrives later (a new connection, a head still arriving at the end) is answered 404 with
``Connection: close``, so an agent that keeps calling leaves no connection open. Requests
pipelined on the connection (sent before their answers) are each answered in order, and only the
last one's response closes it. A connection that served
anything else (another episode, the header form ``X-Agentgym-Episode``, rewards, the standalone
API) may belong to a client shared across episodes and is left to the keep-alive timeout.

The client's own socket then sees the close (``CLOSE_WAIT``) and is released when the client
is closed or collected; only the client can close it.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections import OrderedDict
from typing import Any

from agentgym_lightning.gateway.http_limits import LimitedHttpToolsProtocol

__all__ = ["EpisodeConnections", "EpisodeHttpProtocol"]

#: The routes under an episode's base URL: only that episode's clients send these.
_BASE_URL_ROUTE = re.compile(r"/episodes/([^/]+)/v1/")
#: How many ended episodes are remembered, so that a request for one after its end (on a new
#: connection, or one whose request head was still arriving at the end) closes its connection.
_ENDED_REMEMBERED = 4096


class EpisodeConnections:
    """The gateway server's connections by the one episode each has served. Its state lives on
    the server's event loop (the ended episodes' ids behind a lock); :meth:`end` may be called
    from any thread."""

    def __init__(self) -> None:
        self._by_episode: dict[str, set[EpisodeHttpProtocol]] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._ended_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the connections live on (set by the first one)."""
        self._loop = loop

    def served(self, connection: EpisodeHttpProtocol, path: str) -> None:
        """``connection`` received a request for ``path`` (on the loop)."""
        if connection.shared:
            return
        match = _BASE_URL_ROUTE.match(path)
        episode_id = match.group(1) if match else None
        if episode_id is not None and connection.episode_id in (None, episode_id):
            connection.episode_id = episode_id
            with self._ended_lock:
                ended = episode_id in self._ended
            if ended:
                # Answered 404 (the episode is over): nothing can use the connection again.
                connection.close_after_response()
                return
            self._by_episode.setdefault(episode_id, set()).add(connection)
            return
        connection.shared = True  # not one episode's alone: never closed for an episode's end
        self.lost(connection)

    def lost(self, connection: EpisodeHttpProtocol) -> None:
        """Forget ``connection`` (closed, or no longer one episode's; on the loop)."""
        if connection.episode_id is None:
            return
        connections = self._by_episode.get(connection.episode_id)
        if connections is not None:
            connections.discard(connection)
            if not connections:
                del self._by_episode[connection.episode_id]

    def end(self, episode_id: str) -> None:
        """The episode ended: close its connections (on the loop, soon). Thread-safe."""
        with self._ended_lock:
            self._ended[episode_id] = None
            if len(self._ended) > _ENDED_REMEMBERED:
                self._ended.popitem(last=False)
        loop = self._loop
        if loop is None:
            return  # no connection was ever made
        try:
            loop.call_soon_threadsafe(self._end, episode_id)
        except RuntimeError:
            pass  # the server has stopped: its connections are gone

    def _end(self, episode_id: str) -> None:
        for connection in self._by_episode.pop(episode_id, set()):
            connection.close_for_episode_end()


class EpisodeHttpProtocol(LimitedHttpToolsProtocol):
    """The gateway's HTTP protocol (:class:`LimitedHttpToolsProtocol`'s limits) that tells
    ``episodes`` which episode it serves, and closes when that episode ends."""

    def __init__(self, *args: Any, episodes: EpisodeConnections, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.episodes = episodes
        #: The one episode whose base URL every request so far went to.
        self.episode_id: str | None = None
        #: Served something else: left to the keep-alive timeout.
        self.shared = False
        #: The request whose response will say ``Connection: close`` (its episode ended).
        self._closing: Any = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.episodes.attach(self.loop)
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.episodes.lost(self)
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        ahead = self._closing
        super().on_headers_complete()
        if ahead is not None and not ahead.response_started:
            # A request pipelined behind one that was to close the connection: that one stays
            # open, so every pipelined request is answered in order; the last decides.
            ahead.keep_alive = True
            self._closing = None
        path = self.scope.get("path")  # absent for an Upgrade request, which is served and closed
        self.episodes.served(self, path if isinstance(path, str) else "")

    def close_for_episode_end(self) -> None:
        """Its episode ended: close it now if it is idle, else say ``Connection: close`` on the
        response in flight. A response already under way is left to finish (the keep-alive
        timeout closes the connection after it)."""
        if self.transport.is_closing():
            return
        if self._waiting_for_request() and not self._head_bytes:
            self.transport.close()
        elif self.cycle is not None and not self.cycle.response_started:
            self._close_after(self.cycle)  # the last request read (uvicorn's cycle): those before it answered
        # else a head still arriving: closed after its answer (:meth:`EpisodeConnections.served`)

    def close_after_response(self) -> None:
        """Say ``Connection: close`` on the response to the request just read, and close,
        unless another request is pipelined behind it (then that one's response closes)."""
        if self.cycle is not None:
            self._close_after(self.cycle)

    def _close_after(self, cycle: Any) -> None:
        if cycle.keep_alive:  # not when the client asked to close (HTTP/1.0, Connection: close)
            cycle.keep_alive = False
            self._closing = cycle
