"""One episode's connection to an MCP tool server, through the official ``mcp`` SDK.

``server`` is what the user typed: an ``http://`` or ``https://`` URL is a streamable-HTTP server
(the MCP endpoint itself, e.g. ``http://127.0.0.1:8000/mcp``); anything else is a command line that
starts a stdio server (``python my_server.py``, ``uvx some-mcp-server --flag``), split as a shell
would split it. Each episode opens its own session (a stdio server is started per episode), so a
server that keeps state per session starts every episode afresh.

What can go wrong, and what it becomes:

* the tool said it failed (``isError``), a tool the server does not list, arguments that are not
  a JSON object: a :class:`ToolResult` with ``error`` set; the model reads the message and may try
  again (the episode goes on; AIR counts it).
* the server cannot be started or reached, closes the connection, does not answer within
  ``timeout`` seconds, or answers with something the SDK cannot read: :class:`MCPServerError`, a
  ``ConnectionError``, so the episode ends ``infra_failed`` (the default failure classification,
  ``plugins/errors.py``): the server's fault, never trained on as the model's.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentgym_lightning.framework_agent import require_extra

if TYPE_CHECKING:
    from mcp import ClientSession

__all__ = ["MCPServer", "MCPServerError", "ToolResult", "ToolSession", "open_tool_session", "tool_schema"]


class MCPServerError(ConnectionError):
    """The MCP server failed the episode: it could not be started or reached, died, hung or
    answered something unreadable. A ``ConnectionError``, so the episode ends ``infra_failed``."""


@dataclass(frozen=True)
class MCPServer:
    """Where the tools are: a streamable-HTTP ``url`` or a stdio ``command`` (argv)."""

    url: str | None = None
    command: tuple[str, ...] = ()

    @classmethod
    def parse(cls, server: str) -> MCPServer:
        """``http(s)://...`` is a URL, anything else a command line. Raises ``ValueError`` for an
        empty one."""
        text = server.strip()
        if text.startswith(("http://", "https://")):
            return cls(url=text)
        argv = tuple(shlex.split(text))
        if not argv:
            raise ValueError("server= is empty: give a stdio command (`python my_server.py`) or a streamable HTTP URL")
        return cls(command=argv)

    def __str__(self) -> str:
        return self.url or shlex.join(self.command)


@dataclass(frozen=True)
class ToolResult:
    """What a tool call gave back: its text (every text content joined; structured content as
    JSON when there is no text), and ``error`` (``"tool_error"``, ``"unknown_tool"``,
    ``"bad_arguments"``) when it failed."""

    text: str
    error: str | None = None


def tool_schema(tool: Any) -> dict[str, Any]:
    """An MCP ``Tool`` (name, description, JSON-schema ``inputSchema``) as an OpenAI function tool."""
    parameters = dict(tool.input_schema or {}) or {"type": "object", "properties": {}}
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description or "", "parameters": parameters},
    }


class ToolSession:
    """An initialized MCP session: the server's tools as OpenAI tools (:attr:`tools`), and
    :meth:`call` to run one."""

    def __init__(self, server: MCPServer, session: ClientSession, tools: list[dict[str, Any]], timeout: float) -> None:
        self.server = server
        self.tools = tools
        self._session = session
        self._names = {t["function"]["name"] for t in tools}
        self._timeout = timeout

    async def call(self, name: str, arguments: str | dict[str, Any] | None) -> ToolResult:
        """Call tool ``name`` with ``arguments`` (a JSON object, or its text as the model wrote it).
        The model's mistakes come back as a :class:`ToolResult` with ``error``; the server's raise
        :class:`MCPServerError`."""
        if name not in self._names:
            return ToolResult(f"there is no tool {name!r}; the tools are: {', '.join(sorted(self._names))}", "unknown_tool")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as exc:
                return ToolResult(f"the arguments of {name} are not valid JSON ({exc.msg}); give a JSON object", "bad_arguments")
        if not isinstance(arguments, dict):
            return ToolResult(f"the arguments of {name} must be a JSON object, not {type(arguments).__name__}", "bad_arguments")
        from mcp import MCPError

        try:
            result = await self._session.call_tool(name, arguments, read_timeout_seconds=self._timeout)
        except MCPError as exc:
            if _is_server_failure(exc):
                raise MCPServerError(_failure(self.server, f"calling {name}", exc, self._timeout)) from exc
            # A JSON-RPC error the server chose to send (invalid params...): the model's call was wrong.
            return ToolResult(f"{name} failed: {exc.error.message}", "tool_error")
        except Exception as exc:  # noqa: BLE001 - an unreadable answer: the server's fault, not the model's
            raise MCPServerError(_failure(self.server, f"calling {name}", exc, self._timeout)) from exc
        return ToolResult(_result_text(result), "tool_error" if result.is_error else None)


@asynccontextmanager
async def open_tool_session(server: MCPServer, timeout: float = 30.0) -> AsyncIterator[ToolSession]:
    """Start or reach ``server``, initialize an MCP session and list its tools (every page), within
    ``timeout`` seconds per request; closed (a stdio server stopped) on exit. Raises
    :class:`MCPServerError` when the server cannot be started, reached or read."""
    require_extra("mcp", "mcp")
    from mcp import ClientSession, StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.types import PaginatedRequestParams

    try:
        if server.url is not None:
            transport = streamable_http_client(server.url)
        else:
            transport = stdio_client(StdioServerParameters(command=server.command[0], args=list(server.command[1:])))
        async with transport as streams, ClientSession(streams[0], streams[1], read_timeout_seconds=timeout) as session:
            try:
                await session.initialize()
                tools, cursor = [], None
                while True:
                    page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
                    tools += [tool_schema(t) for t in page.tools]
                    cursor = page.next_cursor
                    if not cursor:
                        break
            except MCPServerError:
                raise
            except Exception as exc:  # noqa: BLE001 - whatever stopped the handshake is the server's
                raise MCPServerError(_failure(server, "starting the session", exc, timeout)) from exc
            if not tools:
                raise MCPServerError(f"MCP server `{server}` lists no tools: an agent needs at least one; check the server's tool registration")
            yield ToolSession(server, session, tools, timeout)
    except MCPServerError:
        raise
    except BaseExceptionGroup as group:  # the SDK's task groups wrap what failed inside them
        inner = _first(group)
        if isinstance(inner, MCPServerError):
            raise inner from None
        if not isinstance(inner, Exception):
            raise
        raise MCPServerError(_failure(server, "talking to it", inner, timeout)) from inner
    except OSError as exc:  # the command does not exist or cannot run
        raise MCPServerError(_failure(server, "starting it", exc, timeout)) from exc


def _first(group: BaseExceptionGroup) -> BaseException:
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def _is_server_failure(exc: Any) -> bool:
    from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT

    # Raised by the SDK itself (no answer in time, the connection gone), not sent by the server.
    return exc.error.code in (REQUEST_TIMEOUT, CONNECTION_CLOSED)


def _failure(server: MCPServer, doing: str, exc: BaseException, timeout: float) -> str:
    detail = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
    hint = (
        f"it did not answer within {timeout:g} s (raise it with --env-kwarg tool_timeout=SECONDS, or fix the hang)"
        if "timed out" in str(exc).lower() or isinstance(exc, TimeoutError)
        else "check that the server starts and answers on its own, and that server= is its stdio command or "
        "its streamable HTTP URL (ending in /mcp)"
    )
    return f"MCP server `{server}` failed while {doing}: {detail}; {hint}"


def _result_text(result: Any) -> str:
    texts = [c.text for c in result.content if getattr(c, "type", None) == "text"]
    if texts:
        return "\n".join(texts)
    if result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    kinds = sorted({getattr(c, "type", "unknown") for c in result.content})
    return f"(the tool returned no text: {', '.join(kinds)} content)" if kinds else "(the tool returned nothing)"
