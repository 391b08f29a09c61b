"""The LangChain / LangGraph adapter: agents get a ``ChatOpenAI`` pointed at their episode.

    from langgraph.graph import StateGraph
    from agentgym_lightning.plugins.langchain_adapter import LangChainAgent

    async def sql_agent(task, llm):          # llm: a langchain_openai.ChatOpenAI
        graph = build_graph(llm)             # as LangGraph's documentation writes it
        return await graph.ainvoke({"question": task["question"]})

    env = AgentEnv(LangChainAgent(sql_agent), tasks, reward_fn)

Every ``llm.invoke``/``ainvoke``/``stream``/``astream`` (and every call LangGraph's prebuilt agents
make with it) is one env step. Tool calls travel in OpenAI format: LangChain's ``bind_tools``
sends ``tools``, the policy answers ``tool_calls``, the framework runs its tools and sends the
results back as ``tool`` messages. ``streaming=True`` sends ``stream: true``; the gateway answers
with server-sent events.

**Agent names.** Each request carries ``metadata["agent"]``: the LangGraph node that made it
(``langgraph_node``), or the name of a ``create_agent(name=...)`` agent, so that
``agent_match`` can select the nodes to train (``"writer|rewriter"``). A name the agent put in the
request's metadata itself (``llm.bind(metadata={"agent": ...})``) wins.

**Traces.** With the ``tracing`` extra and OpenInference's LangChain instrumentor (both in the
``langchain`` extra), LangChain/LangGraph's runs are traced on the process's OpenTelemetry
provider (turned on once, on the first episode) and each episode's spans reach it: a tool's
span becomes a semantic variable of the call that asked for it (``outcome["otel.tools"]``), a
failing tool an AIR signal (``otel.tool_error``; see :mod:`agentgym_lightning.tracing.join`).

**No network.** The model client only ever reaches the episode's gateway, and LangSmith
tracing is switched off for the agent's run whatever the environment variables say.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agentgym_lightning.framework_agent import FrameworkAgent, _named, require_extra
from agentgym_lightning.hookspecs import hookimpl
from agentgym_lightning.tracing.processor import instrument_once

if TYPE_CHECKING:
    from agentgym_lightning.agent import AgentContext

__all__ = ["LangChainAgent", "langchain_agent", "episode_chat_model", "agent_name_of"]

#: Metadata keys that name the part of a LangChain program making a call, best first.
NAME_KEYS = ("lc_agent_name", "langgraph_node")


def agent_name_of(run_metadata: dict[str, Any] | None) -> str | None:
    """The framework's name for the caller, from a LangChain run's metadata (``None`` if none)."""
    for key in NAME_KEYS:
        value = (run_metadata or {}).get(key)
        if isinstance(value, str) and value and not value.startswith("__"):
            return value
    return None


@functools.cache
def _episode_chat_class() -> type:
    """``ChatOpenAI`` plus the caller's name in each request (built on first use: the import of
    ``langchain_openai`` costs ~1 s and is optional)."""
    from langchain_core.runnables.config import var_child_runnable_config
    from langchain_openai import ChatOpenAI

    class EpisodeChatOpenAI(ChatOpenAI):
        """A ``ChatOpenAI`` that says which LangGraph node / LangChain agent makes each call."""

        @staticmethod
        def _named(kwargs: dict[str, Any], run_manager: Any) -> dict[str, Any]:
            # LangChain's streaming path calls _stream/_astream without the run manager; the
            # config of the running child (the model call) carries the same metadata.
            run_metadata = getattr(run_manager, "metadata", None) or (var_child_runnable_config.get() or {}).get("metadata")
            name = agent_name_of(run_metadata)
            if name is not None:
                metadata = dict(kwargs.get("metadata") or {})
                metadata.setdefault("agent", name)
                kwargs["metadata"] = metadata
            return kwargs

        def _generate(self, messages, stop=None, run_manager=None, **kwargs):  # type: ignore[no-untyped-def]
            return super()._generate(messages, stop, run_manager, **self._named(kwargs, run_manager))

        async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs):  # type: ignore[no-untyped-def]
            return await super()._agenerate(messages, stop, run_manager, **self._named(kwargs, run_manager))

        def _stream(self, messages, stop=None, run_manager=None, **kwargs):  # type: ignore[no-untyped-def]
            yield from super()._stream(messages, stop, run_manager, **self._named(kwargs, run_manager))

        async def _astream(self, messages, stop=None, run_manager=None, **kwargs):  # type: ignore[no-untyped-def]
            async for chunk in super()._astream(messages, stop, run_manager, **self._named(kwargs, run_manager)):
                yield chunk

    return EpisodeChatOpenAI


def episode_chat_model(ctx: AgentContext, *, asynchronous: bool = True, **kwargs: Any) -> Any:
    """A ``langchain_openai.ChatOpenAI`` pointed at ``ctx``'s episode.

    ``kwargs`` are ``ChatOpenAI`` fields (``temperature``, ``max_tokens``, ``streaming``...).
    Retries are off (a refused call is a signal, not a glitch) and the Chat Completions API is
    used (the gateway serves no Responses API).
    """
    LangChainAgent.check_installed()
    kwargs.setdefault("max_retries", 0)
    kwargs.setdefault("timeout", None)
    kwargs.setdefault("use_responses_api", False)
    clients: dict[str, Any] = {"http_client": ctx.http_client()}
    if asynchronous:
        clients["http_async_client"] = ctx.async_http_client()
    return _episode_chat_class()(
        model=ctx.model, base_url=ctx.base_url_for_clients, api_key=ctx.api_key, **clients, **kwargs
    )


class LangChainAgent(FrameworkAgent):
    """A LangChain / LangGraph agent ``fn(task, llm) -> result`` (sync or ``async``).

    Args:
        fn: The agent; ``llm`` is a ``ChatOpenAI`` pointed at the episode.
        name: Shown in logs (default: ``fn``'s name).
        **chat_options: ``ChatOpenAI`` fields for ``llm`` (``temperature``, ``max_tokens``,
            ``streaming``...).
    """

    extra = "langchain"
    modules = ("langchain_openai",)

    def __init__(self, fn: Callable[..., Any], *, name: str | None = None, **chat_options: Any) -> None:
        super().__init__(fn, name=name)
        self.chat_options = chat_options

    def make_client(self, ctx: AgentContext, *, asynchronous: bool) -> Any:
        instrument_once("openinference.instrumentation.langchain", _instrument_langchain)
        return episode_chat_model(ctx, asynchronous=asynchronous, **self.chat_options)

    async def aclose_client(self, client: Any) -> None:
        http = getattr(client, "http_async_client", None)
        if http is not None:
            await http.aclose()

    def as_agent(self) -> Callable[..., Any]:
        agent = super().as_agent()
        if self.is_async:

            async def untraced_async(task: Any, ctx: AgentContext) -> Any:
                with _no_tracing():
                    return await agent(task, ctx)

            return _named(untraced_async, self.name)

        def untraced(task: Any, ctx: AgentContext) -> Any:
            with _no_tracing():
                return agent(task, ctx)

        return _named(untraced, self.name)


def _instrument_langchain() -> None:
    from openinference.instrumentation.langchain import LangChainInstrumentor

    LangChainInstrumentor().instrument()


def _no_tracing() -> Any:
    """LangSmith off for this run, whatever ``LANGSMITH_TRACING`` says (a context manager)."""
    require_extra("langchain", "langsmith")
    from langsmith.run_helpers import tracing_context

    return tracing_context(enabled=False)


def langchain_agent(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Decorator form of :class:`LangChainAgent`: ``@langchain_agent`` or ``@langchain_agent(temperature=0)``."""
    if fn is None:
        return lambda f: LangChainAgent(f, **options)
    return LangChainAgent(fn, **options)


@hookimpl
def agentgym_adapt_agent(agent: object) -> Callable[..., Any] | None:
    if isinstance(agent, LangChainAgent):
        return agent.as_agent()
    return None
