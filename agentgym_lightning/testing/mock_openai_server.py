"""A tiny OpenAI-compatible chat server that answers instantly: for tests, benchmarks and demos.

It stands in for ``vllm serve`` or a hosted API in front of
:class:`~agentgym_lightning.policies.openai.OpenAIPolicy` and counts what it sees: requests,
requests in flight now and the most in flight at once. It can also hold requests until N are in flight (to prove a client really sends N at once), fail the
next K requests with a status, and mimic a server without vLLM's token-id extension.

In-process (a uvicorn thread)::

    with MockOpenAIServer() as server:
        policy = OpenAIPolicy("mock", base_url=server.base_url)

In another process (no GIL shared with the code under test), controlled over HTTP::

    python -m agentgym_lightning.testing.mock_openai_server --port 0     # prints "listening on <url>"

Control endpoints (JSON): ``GET /stats``; ``POST /control`` with any of ``{"reset": true,
"hold_until": 256, "hold_timeout": 10, "fail_next": 2, "fail_status": 503,
"token_ids": false, "delay": 0.01}``.

Every answer is deterministic: the content is ``"ok"`` unless a ``responder`` (in-process only)
says otherwise; with ``return_token_ids`` the ids are the UTF-8 bytes of the last message and of
the answer; with ``logprobs`` each token gets ``-0.5``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentgym_lightning.commands.serve import SignalWakeup
from agentgym_lightning.gateway.limits import GatewayLimits
from agentgym_lightning.gateway.server import ThreadedServer

__all__ = ["MockOpenAIServer", "MockState", "default_reply", "build_app", "spawn_mock_server"]

#: Takes the request body, returns a ``chat.completion`` body, or ``(status, body)`` for an error.
Responder = Callable[[dict[str, Any]], "dict[str, Any] | tuple[int, dict[str, Any]]"]


@dataclass
class MockState:
    """What the mock has seen and how it behaves; mutate it through :class:`MockOpenAIServer`."""

    requests: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    #: Hold each request until this many are in flight at once (0: answer at once).
    hold_until: int = 0
    hold_timeout: float = 10.0
    #: Requests that timed out waiting for ``hold_until`` (answered anyway).
    hold_timeouts: int = 0
    #: Fail the next this-many chat requests with ``fail_status``.
    fail_next: int = 0
    fail_status: int = 503
    #: Whether ``return_token_ids`` is understood (False: rejected with a 400, like OpenAI's API).
    token_ids: bool = True
    #: Seconds to sleep before each answer.
    delay: float = 0.0
    #: Keep each chat request body in ``bodies``.
    record: bool = True

    def stats(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "hold_timeouts": self.hold_timeouts,
        }


def _text_ids(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def default_reply(body: dict[str, Any], content: str = "ok") -> dict[str, Any]:
    """A ``chat.completion`` answering ``body`` with ``content`` (ids/logprobs if asked for)."""
    messages = body.get("messages") or [{}]
    last = messages[-1].get("content") if isinstance(messages[-1], dict) else ""
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": content},
        "finish_reason": "stop",
        "logprobs": None,
    }
    completion_ids = _text_ids(content)
    if body.get("logprobs"):
        choice["logprobs"] = {
            "content": [{"token": chr(i), "logprob": -0.5, "bytes": [i], "top_logprobs": []} for i in completion_ids]
        }
    reply: dict[str, Any] = {
        "id": "chatcmpl-mock",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model") or "mock",
        "choices": [choice],
        "usage": {"prompt_tokens": 1, "completion_tokens": len(completion_ids), "total_tokens": 1 + len(completion_ids)},
    }
    if body.get("return_token_ids"):
        reply["prompt_token_ids"] = _text_ids(str(last or ""))
        choice["token_ids"] = completion_ids
    return reply


def _error(status: int, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "mock_error", "code": status, "param": None}}


def build_app(state: MockState, responder: Responder | None = None, bodies: list[dict[str, Any]] | None = None) -> Any:
    """The Starlette app of the mock (routes under ``/v1`` plus ``/stats`` and ``/control``)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    released: dict[str, asyncio.Event] = {}

    def _release_event() -> asyncio.Event:
        # Created lazily so it belongs to the server's loop.
        if "ev" not in released:
            released["ev"] = asyncio.Event()
        return released["ev"]

    async def chat(request: Request) -> Response:
        raw = await request.body()
        state.requests += 1
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            try:
                body = json.loads(raw)
            except json.JSONDecodeError:
                return JSONResponse(_error(400, "body is not JSON"), status_code=400)
            if bodies is not None and state.record:
                bodies.append(body)
            if state.hold_until:
                event = _release_event()
                if state.in_flight >= state.hold_until:
                    event.set()
                if not event.is_set():
                    try:
                        await asyncio.wait_for(event.wait(), state.hold_timeout)
                    except TimeoutError:
                        state.hold_timeouts += 1
            if state.delay:
                await asyncio.sleep(state.delay)
            if state.fail_next > 0:
                state.fail_next -= 1
                return JSONResponse(_error(state.fail_status, "injected failure"), status_code=state.fail_status)
            if body.get("return_token_ids") and not state.token_ids:
                return JSONResponse(
                    _error(400, "Unrecognized request argument supplied: return_token_ids"), status_code=400
                )
            result = responder(body) if responder is not None else default_reply(body)
            if isinstance(result, tuple):
                status, payload = result
                return Response(json.dumps(payload), status_code=status, media_type="application/json")
            return Response(json.dumps(result), media_type="application/json")
        finally:
            state.in_flight -= 1

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "mock", "object": "model", "created": 0, "owned_by": "mock"}]})

    async def stats(request: Request) -> Response:
        return JSONResponse(state.stats())

    async def control(request: Request) -> Response:
        data = json.loads(await request.body() or b"{}")
        if data.pop("reset", False):
            state.requests = state.max_in_flight = state.hold_timeouts = 0
            state.hold_until = state.fail_next = 0
            state.delay = 0.0
            released.pop("ev", None)
            if bodies is not None:
                bodies.clear()
        for key, value in data.items():
            if not hasattr(state, key) or key in ("requests", "in_flight", "max_in_flight"):
                return JSONResponse(_error(400, f"unknown control {key!r}"), status_code=400)
            setattr(state, key, value)
            if key == "hold_until":
                released.pop("ev", None)
        return JSONResponse({"ok": True, **state.stats()})

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/stats", stats, methods=["GET"]),
        Route("/control", control, methods=["POST"]),
    ]
    return Starlette(routes=routes)


class MockOpenAIServer:
    """The mock, served by uvicorn on a daemon thread of this process (``127.0.0.1`` only).

    Args:
        responder: Builds each answer from the request body (default :func:`default_reply`).
        port: Port to bind (0: a free one).
        **state: Initial :class:`MockState` fields (``hold_until=256``, ``token_ids=False``...).
    """

    def __init__(self, responder: Responder | None = None, *, port: int = 0, **state: Any) -> None:
        self.state = MockState(**state)
        self.bodies: list[dict[str, Any]] = []
        # Clients of a benchmark keep their connections across long pauses: a long keep-alive.
        self._server = ThreadedServer(
            build_app(self.state, responder, self.bodies),
            "127.0.0.1",
            port,
            name="mock-openai",
            limits=GatewayLimits(keep_alive_timeout=600.0),
        )
        self.port: int = self._server.port
        self._started = False

    @property
    def url(self) -> str:
        return self._server.url

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (``.../v1``)."""
        return f"{self.url}/v1"

    def start(self, timeout: float = 30.0) -> MockOpenAIServer:
        if not self._started:
            self._server.start(timeout)
            self._started = True
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._server.stop(timeout)

    def __enter__(self) -> MockOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def spawn_mock_server(python: str | None = None, timeout: float = 30.0) -> tuple[Any, str]:
    """Start the mock in a child process; ``(popen, url)``. Stop it with ``popen.terminate()``."""
    import subprocess

    proc = subprocess.Popen(
        [python or sys.executable, "-m", "agentgym_lightning.testing.mock_openai_server", "--port", "0", "--exit-with-parent"],
        stdin=subprocess.PIPE,  # closed when we exit, however we exit: the child then exits too
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("listening on "):
            return proc, line.split()[-1]
    proc.kill()
    raise RuntimeError("the mock OpenAI server process did not start")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--no-token-ids", action="store_true", help="reject return_token_ids like OpenAI's API")
    parser.add_argument("--exit-with-parent", action="store_true", help="exit when standard input closes")
    args = parser.parse_args(argv)
    if args.exit_with_parent:

        def watch() -> None:
            sys.stdin.read()
            os._exit(0)

        threading.Thread(target=watch, daemon=True).start()
    server = MockOpenAIServer(port=args.port, token_ids=not args.no_token_ids, record=False)
    server.start()
    print(f"listening on {server.url}", flush=True)
    try:
        with SignalWakeup() as wakeup:  # Ctrl-C wakes it whichever thread takes the signal (serve's reason)
            while True:
                wakeup.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
