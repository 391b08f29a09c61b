"""HTTP servers of this process (the gateway's, the policy server's, the mock OpenAI server's):
uvicorn on a daemon thread, bound before it is announced, with the byte, time and connection
limits of ``docs/limits.md``; the gateway's also closes an ended episode's connections."""

from __future__ import annotations

import functools
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import uvicorn

from agentgym_lightning.gateway.app import build_app
from agentgym_lightning.gateway.connections import EpisodeConnections, EpisodeHttpProtocol
from agentgym_lightning.gateway.http_limits import LimitedHttpToolsProtocol, ReceivingBodies
from agentgym_lightning.gateway.limits import GatewayLimits

if TYPE_CHECKING:
    from starlette.routing import BaseRoute

    from agentgym_lightning.gateway.router import EpisodeRouter


class ThreadedServer:
    """Serves an ASGI ``app`` with uvicorn on a daemon thread; :meth:`start` returns once it
    accepts connections. ``limits`` bound request heads, bodies, idle time and connections."""

    def __init__(
        self,
        app: Any,
        host: str,
        port: int,
        name: str = "agentgym-gateway",
        limits: GatewayLimits | None = None,
        protocol: Callable[..., LimitedHttpToolsProtocol] = LimitedHttpToolsProtocol,
    ) -> None:
        limits = limits or GatewayLimits()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # We bind the socket ourselves so port 0 resolves before anyone is handed a URL.
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError as exc:
            self._sock.close()
            raise OSError(f"{name} cannot bind {host}:{port} ({exc}); pick another port or 0 for a free one") from exc
        self._sock.listen(4096)
        self.port: int = self._sock.getsockname()[1]
        #: The request bodies still arriving on this server's connections (its event loop's to change).
        self.bodies = ReceivingBodies(limits.receiving_body_cap())
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            ws="none",
            # uvicorn's httptools protocol plus head and body size/time limits, the bodies still arriving
            # (all connections together) and the connection cap.
            http=functools.partial(protocol, limits=limits, bodies=self.bodies),  # type: ignore[arg-type]
            # Idle time between a response and the next request. uvicorn arms it only once a
            # response is complete, so a call waiting minutes for its generation is never cut.
            timeout_keep_alive=limits.keep_alive_timeout,
            backlog=4096,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, name=name, daemon=True)

    @property
    def url(self) -> str:
        host = self._sock.getsockname()[0]
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the server exited during start-up; see the log above")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server did not start within {timeout} s")
            time.sleep(0.005)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving and close the socket (also when it was never started). Idempotent."""
        self._server.should_exit = True
        if self._thread.ident is not None:
            self._thread.join(timeout)
        self._sock.close()


class GatewayServer(ThreadedServer):
    """Serves a gateway's app (:func:`build_app`: its router plus ``extra_routes``) under the
    gateway's limits; :meth:`end_episode` closes the connections an ended episode's clients
    left open (:mod:`.connections`)."""

    def __init__(
        self,
        router: EpisodeRouter,
        host: str,
        port: int,
        limits: GatewayLimits | None = None,
        extra_routes: Sequence[BaseRoute] = (),
    ) -> None:
        self.connections = EpisodeConnections()
        protocol = functools.partial(EpisodeHttpProtocol, episodes=self.connections)
        super().__init__(build_app(router, extra_routes), host, port, limits=limits or router.limits, protocol=protocol)

    def end_episode(self, episode_id: str) -> None:
        """Close the keep-alive connections only ``episode_id``'s clients used (thread-safe)."""
        self.connections.end(episode_id)
