"""What an agent sees of the environment: its episode's endpoint, and a tiny API to expose
semantic variables and rewards.

An agent is any callable ``agent(task, ctx)`` (sync or ``async``) that makes its LLM calls through
an OpenAI client pointed at ``ctx.base_url`` (or uses ``ctx.openai_client()``, which skips the
socket when the agent runs in-process). Nothing else about the agent changes::

    def my_agent(task, ctx):
        client = ctx.openai_client()
        reply = client.chat.completions.create(model=ctx.model, messages=[...])
        emit_variable("answer", reply.choices[0].message.content)
        emit_reward(1.0, source="format")       # lands on the call just answered
        return reply.choices[0].message.content

Texts the agent is built around (its system prompt) may come from the episode instead of
constants: ``ctx.resource("system_prompt", default=SYSTEM_PROMPT)`` is the env's resource of that
name when it was given one, else the default (:mod:`agentgym_lightning.resources`;
:func:`read_resource` for code that sees no ``ctx``).
"""

from __future__ import annotations

import contextvars
import inspect
import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import anthropic
    import httpx
    import openai

    from agentgym_lightning.episode import Episode
    from agentgym_lightning.gateway.endpoint import EpisodeEndpoint
    from agentgym_lightning.llm import Completion
    from agentgym_lightning.resources import Resource

__all__ = [
    "AgentContext", "AgentFn", "emit_variable", "emit_reward", "read_resource", "current_context", "AgentCancelled",
    "takes_two_arguments",
]

#: An agent: ``fn(task, ctx) -> result``, or an ``async def`` of the same shape.
AgentFn = Callable[[Any, "AgentContext"], Any]



def takes_two_arguments(fn: Callable[..., Any]) -> bool:
    """Whether ``fn(a, b)`` binds: the shape of an agent ``(task, ctx)`` and of a framework agent
    ``(task, client)``. True for a callable without a signature to inspect (a builtin): trust it."""
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError:
        return False
    except ValueError:
        return True
    return True


_current: contextvars.ContextVar[AgentContext | None] = contextvars.ContextVar("agentgym_context", default=None)


class AgentCancelled(BaseException):
    """Raised inside an agent whose episode was closed, truncated or timed out.

    A ``BaseException`` so that an agent's ``except Exception`` cannot swallow it.
    """


class AgentContext:
    """Handed to the agent callable; one per episode: its record (task, variables, rewards) and
    its endpoint (URL, key, clients)."""

    def __init__(self, episode: Episode, endpoint: EpisodeEndpoint) -> None:
        self._episode = episode
        self._endpoint = endpoint
        #: Set when the episode is cancelled; long-running tools may poll it.
        self.cancelled: threading.Event = episode.cancelled

    @property
    def episode_id(self) -> str:
        return self._episode.episode_id

    @property
    def task(self) -> Any:
        return self._episode.trajectory.task

    @property
    def seed(self) -> int | None:
        return self._episode.trajectory.seed

    @property
    def model(self) -> str:
        """The model name to put in requests (any name is accepted; this one reads well in logs)."""
        return self._episode.model_name

    @property
    def base_url(self) -> str:
        """This episode's OpenAI-compatible base URL over HTTP (starts the gateway server if needed).

        Give it to any OpenAI client, in this process or another one.
        """
        return self._endpoint.base_url

    @property
    def anthropic_base_url(self) -> str:
        """This episode's base URL for Anthropic clients, over HTTP: :attr:`base_url` without
        ``/v1`` (the ``anthropic`` SDK adds ``/v1/messages`` itself)."""
        return self._endpoint.anthropic_base_url

    @property
    def api_key(self) -> str:
        """The key to send (the gateway's bearer token; any value works on 127.0.0.1)."""
        return self._endpoint.api_key

    def http_client(self) -> httpx.Client:
        """An ``httpx.Client`` for this episode: in-process unless the env uses ``transport="http"``.
        It is closed when the episode ends."""
        return self._endpoint.http_client()

    def async_http_client(self) -> httpx.AsyncClient:
        """An ``httpx.AsyncClient`` for this episode; closed when the episode ends (``async def``
        agents)."""
        return self._endpoint.async_http_client()

    def openai_client(self, **kwargs: Any) -> openai.OpenAI:
        """An ``openai.OpenAI`` pointed at this episode (no retries: a failed call is a signal)."""
        import openai

        kwargs.setdefault("max_retries", 0)
        kwargs.setdefault("timeout", None)
        return openai.OpenAI(base_url=self.base_url_for_clients, api_key=self.api_key, http_client=self.http_client(), **kwargs)

    def async_openai_client(self, **kwargs: Any) -> openai.AsyncOpenAI:
        import openai

        kwargs.setdefault("max_retries", 0)
        kwargs.setdefault("timeout", None)
        return openai.AsyncOpenAI(
            base_url=self.base_url_for_clients, api_key=self.api_key, http_client=self.async_http_client(), **kwargs
        )

    def anthropic_client(self, **kwargs: Any) -> anthropic.Anthropic:
        """An ``anthropic.Anthropic`` pointed at this episode's ``/v1/messages`` (no retries; in
        process unless the env uses ``transport="http"``; needs the ``[anthropic]`` extra)."""
        import anthropic
        import httpx2

        from agentgym_lightning.gateway.httpx2_bridge import Httpx2Bridge

        kwargs.setdefault("max_retries", 0)
        kwargs.setdefault("timeout", None)
        http = httpx2.Client(transport=Httpx2Bridge(self.http_client()), timeout=None, trust_env=False)
        return anthropic.Anthropic(base_url=self._anthropic_client_url, api_key=self.api_key, http_client=http, **kwargs)

    def async_anthropic_client(self, **kwargs: Any) -> anthropic.AsyncAnthropic:
        """An ``anthropic.AsyncAnthropic`` pointed at this episode (``async def`` agents)."""
        import anthropic
        import httpx2

        from agentgym_lightning.gateway.httpx2_bridge import AsyncHttpx2Bridge

        kwargs.setdefault("max_retries", 0)
        kwargs.setdefault("timeout", None)
        http = httpx2.AsyncClient(transport=AsyncHttpx2Bridge(self.async_http_client()), timeout=None, trust_env=False)
        return anthropic.AsyncAnthropic(base_url=self._anthropic_client_url, api_key=self.api_key, http_client=http, **kwargs)

    @property
    def _anthropic_client_url(self) -> str:
        return self.base_url_for_clients.removesuffix("/v1")

    @property
    def base_url_for_clients(self) -> str:
        """The base URL the ready-made clients use: in-process it needs no server."""
        return self._endpoint.client_base_url

    def chat_completion(self, messages: list[dict[str, Any]], **params: Any) -> Completion:
        """Make one LLM call with no HTTP client at all (the fastest path, for agents written
        for this library); returns the :class:`~agentgym_lightning.llm.Completion` with its token
        ids. ``params`` are OpenAI request fields (``tools``, ``temperature``, ``metadata``...)."""
        body = {"model": self.model, "messages": messages, **params}
        return self._endpoint.submit(body).wait()

    async def achat_completion(self, messages: list[dict[str, Any]], **params: Any) -> Completion:
        """``async`` twin of :meth:`chat_completion`."""
        body = {"model": self.model, "messages": messages, **params}
        return await self._endpoint.submit(body).wait_async()

    @property
    def resources(self) -> Mapping[str, Resource]:
        """The episode's resources by name (read-only): each a
        :class:`~agentgym_lightning.resources.Resource` (``name``, ``text``, ``version``)."""
        return MappingProxyType(self._episode.resources)

    def resource(self, name: str, default: str | None = None) -> str:
        """The text of the episode's resource ``name``, or ``default`` when the env was given
        none of that name (the agent's own constant: no resources, no change). Raises
        ``KeyError`` when there is neither."""
        found = self._episode.resources.get(name)
        if found is not None:
            text = found.text
        elif default is None:
            given = ", ".join(sorted(self._episode.resources)) or "none"
            raise KeyError(
                f"this episode has no resource {name!r} (given: {given}): pass resources={{{name!r}: ...}} to the env, "
                "or give the agent a default"
            )
        else:
            text = default
        self._episode.resources_read[name] = text
        return text

    def emit_variable(self, name: str, value: Any) -> None:
        """Expose a semantic variable (shown in later observations; recorded on the step)."""
        self._episode.emit_variable(name, value)

    def emit_reward(self, value: float, source: str = "agent") -> None:
        """Add a reward to the LLM call most recently answered (to the episode before any call)."""
        self._episode.emit_reward(value, source)


def current_context() -> AgentContext:
    """The context of the agent running in this thread / task."""
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError(
            "no agent episode is running here: emit_variable/emit_reward must be called from inside "
            "an agent started by AgentEnv (or use the ctx argument it was given)"
        )
    return ctx


def emit_variable(name: str, value: Any) -> None:
    """Expose a semantic variable of the running agent (see :meth:`AgentContext.emit_variable`)."""
    current_context().emit_variable(name, value)


def emit_reward(value: float, source: str = "agent") -> None:
    """Give the running agent's last answered LLM call a reward (see :meth:`AgentContext.emit_reward`)."""
    current_context().emit_reward(value, source)


def read_resource(name: str, default: str | None = None) -> str:
    """The running episode's resource ``name`` (see :meth:`AgentContext.resource`), for code that
    sees no ``ctx`` (a framework agent, handed only its model client). Outside an episode (the
    agent run on its own) it is ``default``; ``KeyError`` when there is neither."""
    ctx = _current.get()
    if ctx is not None:
        return ctx.resource(name, default)
    if default is None:
        raise KeyError(f"no agent episode is running here, so there is no resource {name!r}: give a default")
    return default


def bind_context(ctx: AgentContext) -> contextvars.Token[AgentContext | None]:
    """Make ``ctx`` what :func:`current_context` returns in this thread / task (the agent's
    worker does this before it calls the agent)."""
    return _current.set(ctx)
