"""``openenv:MODULE``: an OpenEnv environment's server app, imported and served in this process.

An OpenEnv environment ships its server as an ASGI app (``create_app(...)``, conventionally
``server/app.py``'s ``app``). ``MODULE`` names it, ``package.server.app`` (its ``app``) or
``package.server.app:name``; it is served by uvicorn on 127.0.0.1, on a free port, on a daemon
thread, once per process, and the episodes reach it as they reach a remote server (openenv's own
client, one WebSocket session each).
"""

from __future__ import annotations

import importlib
import os
import socket
import sys
import threading
import time
from typing import Any

__all__ = ["serve_module"]

_served: dict[str, str] = {}
_lock = threading.Lock()


def serve_module(target: str, timeout: float = 60.0) -> str:
    """The base URL of ``target``'s app (``module`` or ``module:attribute``, default ``app``),
    serving it first when this process does not yet. Raises ``ValueError`` when the module does
    not import or has no such app, ``TimeoutError`` when it does not start within ``timeout``."""
    with _lock:
        if target not in _served:
            _served[target] = _start(_load_app(target), target, timeout)
        return _served[target]


def _load_app(target: str) -> Any:
    module_name, _, attribute = target.partition(":")
    if os.getcwd() not in sys.path:  # as `python -m` does: a module beside you imports
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"openenv:{target}: cannot import {module_name!r} ({exc}); give the module of the "
                         "environment's server app (`my_env.server.app`) or the URL of a running server") from None
    app = getattr(module, attribute or "app", None)
    if not callable(app):
        raise ValueError(f"openenv:{target}: {module_name} has no app {attribute or 'app'!r} (the create_app(...) of an "
                         "OpenEnv environment; name another with MODULE:NAME)")
    return app


def _start(app: Any, target: str, timeout: float) -> str:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound here, so the port is known before the thread runs
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"openenv-{target}", daemon=True).start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if time.monotonic() > deadline:
            raise TimeoutError(f"openenv:{target}: its app did not start serving within {timeout:g} s")
        time.sleep(0.01)
    return f"http://127.0.0.1:{sock.getsockname()[1]}"
