"""One episode's session with an OpenEnv server, through openenv-core's own client
(``GenericEnvClient``: its WebSocket session, actions and observations as plain dicts), and the
server's action schema (``GET /schema``) that the agent turns into the model's tool.

A server that cannot be reached, drops the session, does not answer within ``timeout`` seconds or
fails inside its ``reset``/``step`` raises :class:`OpenEnvServerError`, a ``ConnectionError``: the
episode ends ``infra_failed``, naming the server. An action the server refuses as invalid (its
``Action`` model's validation) is :class:`InvalidAction`: the model's mistake, shown to it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

__all__ = ["InvalidAction", "OpenEnvServerError", "OpenEnvSession", "open_session"]


class OpenEnvServerError(ConnectionError):
    """The OpenEnv server failed the episode (down, hung, or raised): ``infra_failed``."""


class InvalidAction(ValueError):
    """The server refused an action as invalid for its ``Action`` model: the message says why."""


class OpenEnvSession:
    """A connected session: :attr:`action_schema` (the JSON schema of the server's actions),
    :meth:`reset` and :meth:`step`, each returning openenv's ``StepResult`` (``observation`` a
    dict, ``reward``, ``done``)."""

    def __init__(self, url: str, client: Any, action_schema: dict[str, Any]) -> None:
        self.url = url
        self.action_schema = action_schema
        self._client = client

    async def reset(self, **kwargs: Any) -> Any:
        """Start the server's episode (``seed``... are passed on; the server keeps those its
        ``reset`` takes)."""
        return await self._call("reset", self._client.reset(**kwargs))

    async def step(self, action: dict[str, Any]) -> Any:
        """Send one action. Raises :class:`InvalidAction` when the server refuses its fields."""
        return await self._call("step", self._client.step(action))

    async def _call(self, what: str, request: Any) -> Any:
        try:
            return await request
        except RuntimeError as exc:  # openenv's client: "Server error: <message> (code: <code>)"
            if "validation_error" in str(exc).lower():
                raise InvalidAction(str(exc).removeprefix("Server error: ")) from None
            raise OpenEnvServerError(_failure(self.url, what, exc)) from exc
        except (OSError, TimeoutError, ValueError) as exc:  # the socket, no answer, unreadable JSON
            raise OpenEnvServerError(_failure(self.url, what, exc)) from exc
        except Exception as exc:  # noqa: BLE001 - websockets' own errors (the connection closed)
            raise OpenEnvServerError(_failure(self.url, what, exc)) from exc


@asynccontextmanager
async def open_session(url: str, timeout: float = 60.0) -> AsyncIterator[OpenEnvSession]:
    """Read the server's action schema and open a WebSocket session (its own environment instance
    on the server); closed on exit. Raises :class:`OpenEnvServerError` when the server is down or
    is no OpenEnv server."""
    from openenv import GenericEnvClient

    base = url.rstrip("/")
    try:
        async with httpx.AsyncClient(timeout=timeout) as http:
            reply = await http.get(f"{base}/schema")
            reply.raise_for_status()
            schema = reply.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise OpenEnvServerError(_failure(base, "reading its /schema", exc)) from exc
    action_schema = schema.get("action") if isinstance(schema, dict) else None
    if not isinstance(action_schema, dict):
        raise OpenEnvServerError(f"OpenEnv server {base} answered /schema without an action schema: is it an OpenEnv server?")
    client = GenericEnvClient(base_url=base, connect_timeout_s=timeout, message_timeout_s=timeout)
    try:
        await client.connect()
    except ConnectionError as exc:
        raise OpenEnvServerError(_failure(base, "opening its session", exc)) from exc
    try:
        yield OpenEnvSession(base, client, action_schema)
    finally:
        await client.close()


def _failure(url: str, doing: str, exc: BaseException) -> str:
    detail = f"{type(exc).__name__}: {exc}".rstrip(": ")
    return (
        f"OpenEnv server {url} failed while {doing}: {detail}; check that it runs and answers "
        f"(`curl {url}/health`), and that --env openenv:URL is its base URL"
    )
