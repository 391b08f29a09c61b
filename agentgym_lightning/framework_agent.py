"""What the framework adapters share: an agent written for a framework, handed the framework's own
model client pointed at its episode.

A framework agent is a function ``fn(task, client) -> result`` (sync or ``async``), written as
the framework's documentation writes it; the only thing that comes from us is ``client``: a
LangChain ``ChatOpenAI``, an OpenAI Agents SDK model, an AutoGen ``OpenAIChatCompletionClient``,
each pointed at the episode's gateway (in-process, no socket, unless the env uses
``transport="http"``). Each adapter plugin (``plugins/langchain_adapter.py``,
``plugins/openai_agents_adapter.py``, ``plugins/autogen_adapter.py``) subclasses
:class:`FrameworkAgent` with the one method that knows its framework, :meth:`make_client`, and
turns its objects into agent callables through the ``agentgym_adapt_agent`` hook.

An ``async`` ``fn`` runs as a task on the gateway's shared event loop, like any ``async def``
agent: no thread per agent. A sync one runs in the episode's worker thread.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agentgym_lightning.agent import takes_two_arguments

if TYPE_CHECKING:
    from agentgym_lightning.agent import AgentContext

__all__ = ["FrameworkAgent", "require_extra"]


def _named(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """Name an agent callable after the agent it runs (logs and errors show it)."""
    fn.__name__ = fn.__qualname__ = name
    return fn


def require_extra(extra: str, *modules: str) -> None:
    """Raise a clear :class:`ImportError` when a framework's optional extra is not installed."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(
            f"this agent needs {', '.join(missing)}, which is not installed: "
            f"pip install 'agentgym-lightning[{extra}]'"
        )


class FrameworkAgent:
    """An agent function of a framework, plus how to build that framework's model client.

    Args:
        fn: ``fn(task, client) -> result``, sync or ``async``; ``client`` is what
            :meth:`make_client` builds for the episode.
        name: Shown in logs and errors (default: ``fn``'s name).

    Subclasses implement :meth:`make_client` (and may override :meth:`close_client`).

    Raises:
        ImportError: the framework (:attr:`modules`) is not installed. Checked here, when the env
            is built, not at the first episode: a run must not start with every episode failing.
    """

    #: The pip extra that installs the framework (for error messages).
    extra: str = ""
    #: The modules the framework needs (checked when the agent is built).
    modules: tuple[str, ...] = ()

    def __init__(self, fn: Callable[..., Any], *, name: str | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"{type(self).__name__} wraps a function fn(task, client), got {type(fn).__name__}")
        if not takes_two_arguments(fn):
            raise TypeError(
                f"{type(self).__name__}: {getattr(fn, '__name__', fn)!r} must accept two arguments (task, client); "
                "client is the framework's model client pointed at the episode"
            )
        self.check_installed()
        self.fn = fn
        self.name = name or getattr(fn, "__name__", type(fn).__name__)

    @classmethod
    def check_installed(cls) -> None:
        """Raise :class:`ImportError` naming the extra to install when the framework is missing
        (an env calls it before loading its data, so a run fails in a second, not after it)."""
        if cls.modules:
            require_extra(cls.extra, *cls.modules)

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn) or inspect.iscoroutinefunction(getattr(self.fn, "__call__", None))

    def make_client(self, ctx: AgentContext, *, asynchronous: bool) -> Any:
        """The framework's model client pointed at ``ctx``'s episode."""
        raise NotImplementedError

    async def aclose_client(self, client: Any) -> None:
        """Release what :meth:`make_client` opened (an async HTTP client) when the agent ends."""

    def close_client(self, client: Any) -> None:
        """Sync twin of :meth:`aclose_client`."""

    def as_agent(self) -> Callable[..., Any]:
        """The agent callable ``agent(task, ctx)`` :class:`~agentgym_lightning.env.AgentEnv` runs:
        ``async`` when ``fn`` is."""
        if self.is_async:

            async def run_async(task: Any, ctx: AgentContext) -> Any:
                client = self.make_client(ctx, asynchronous=True)
                try:
                    return await self.fn(task, client)
                finally:
                    await self.aclose_client(client)

            agent: Callable[..., Any] = run_async
        else:

            def run_sync(task: Any, ctx: AgentContext) -> Any:
                client = self.make_client(ctx, asynchronous=False)
                try:
                    return self.fn(task, client)
                finally:
                    self.close_client(client)

            agent = run_sync
        return _named(agent, self.name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"
