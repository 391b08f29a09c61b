"""The OpenAI Agents SDK adapter: agents get the SDK's own default model, its Responses API
``Model``, pointed at their episode (the gateway serves ``/v1/responses``).

Two ways in. An ``agents.Agent`` as it is (zero code: the adapter runs it with ``Runner.run`` and
its own model for every agent of the run, handoffs included)::

    from agents import Agent, function_tool

    searcher = Agent(name="searcher", instructions="...", tools=[search])
    env = AgentEnv(OpenAIAgentsAgent(searcher), tasks, reward_fn)   # or AgentEnv(searcher, ...)

or an agent function ``fn(task, model)`` that builds and runs its agents itself, handing them
``model`` (``Agent(..., model=model)`` or ``RunConfig(model=model)``)::

    async def rag_agent(task, model):
        agent = Agent(name="searcher", instructions="...", tools=[search], model=model)
        result = await Runner.run(agent, task["question"])
        return result.final_output

    env = AgentEnv(OpenAIAgentsAgent(rag_agent), tasks, reward_fn)

Every model call is one env step; the SDK runs its function tools itself and sends their results
back as ``function_call_output`` items (the policy sees them as ``tool`` messages, as from any
wire); ``Runner.run_streamed`` streams through the gateway. ``OpenAIAgentsAgent(..., api="chat")``
hands out the SDK's Chat Completions model instead (what this adapter gave before the gateway
served the Responses API). Agents SDK code
is ``async``: it runs on the gateway's shared event loop, no thread per agent (sync function
tools run in the SDK's own ``asyncio.to_thread``).

**Agent names.** Each request carries ``metadata["agent"]``: the name of the SDK agent making the
call (read from the SDK's current turn span, which exists even with tracing off), for
``agent_match``.

**Traces, and no network.** The SDK's own tracing exporter posts to api.openai.com. With the
``tracing`` extra and OpenInference's Agents SDK instrumentor (both in the ``openai-agents``
extra), the adapter replaces the SDK's trace processors with OpenInference's, which turns the
SDK's traces into OpenTelemetry spans on the process's provider (process-wide, on the first
episode): each episode's spans reach it (a function tool's span becomes a semantic variable of
the call that asked for it, ``outcome["otel.tools"]``; a failing one the AIR signal
``otel.tool_error``), and nothing is exported to OpenAI. Without them the adapter turns the
SDK's tracing off (``agents.set_tracing_disabled(True)``) and every run it starts passes
``tracing_disabled=True``.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from agentgym_lightning.framework_agent import FrameworkAgent
from agentgym_lightning.hookspecs import hookimpl
from agentgym_lightning.tracing.processor import instrument_once

if TYPE_CHECKING:
    from agentgym_lightning.agent import AgentContext

__all__ = ["OpenAIAgentsAgent", "episode_model", "task_input", "current_agent_name"]


def task_input(task: Any) -> str:
    """What an ``agents.Agent`` run as it is gets as input: the task if it is text, else its
    ``input``, ``question`` or ``prompt`` field."""
    if isinstance(task, str):
        return task
    if isinstance(task, Mapping):
        for key in ("input", "question", "prompt"):
            if isinstance(task.get(key), str):
                return task[key]
    raise TypeError(
        f"don't know what input to give an agents.Agent for a task of type {type(task).__name__}: use a text "
        "task, a dict with 'input'/'question'/'prompt', or OpenAIAgentsAgent(agent, input=fn(task) -> str)"
    )


def current_agent_name() -> str | None:
    """The name of the Agents SDK agent whose turn is running (from its turn or agent span, which
    the SDK keeps current even with tracing off; ``None`` outside a run)."""
    from agents.tracing import get_current_span
    from agents.tracing.span_data import AgentSpanData, TurnSpanData

    data = getattr(get_current_span(), "span_data", None)
    if isinstance(data, TurnSpanData):
        return data.agent_name or None
    if isinstance(data, AgentSpanData):
        return data.name or None
    return None


def traced() -> bool:
    """Whether the SDK's traces reach the episodes: OpenInference's instrumentor replaced the
    SDK's trace processors (its exporter to api.openai.com among them) with its own, on first use."""
    return instrument_once("openinference.instrumentation.openai_agents", _instrument_sdk)


def _instrument_sdk() -> None:
    from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor

    OpenAIAgentsInstrumentor().instrument(exclusive_processor=True)


#: Which of the SDK's OpenAI models an episode's agents get: ``"responses"`` (the SDK's default,
#: ``OpenAIResponsesModel``) or ``"chat"`` (``OpenAIChatCompletionsModel``).
ModelAPI = Literal["responses", "chat"]


@functools.cache
def _episode_model_class(api: ModelAPI = "responses") -> type:
    from agents import ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, set_tracing_disabled

    # Before any run starts: the SDK's default exporter would post traces to api.openai.com.
    set_tracing_disabled(not traced())

    def named(settings: ModelSettings) -> ModelSettings:
        name = current_agent_name()
        if name is None or (settings.metadata or {}).get("agent"):
            return settings
        return settings.resolve(ModelSettings(metadata={**(settings.metadata or {}), "agent": name}))

    base: type = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel

    class EpisodeModel(base):  # type: ignore[misc, valid-type]
        """The SDK's model, saying which agent makes each call."""

        async def get_response(self, system_instructions, input, model_settings, *args, **kwargs):  # type: ignore[no-untyped-def]
            return await super().get_response(system_instructions, input, named(model_settings), *args, **kwargs)

        async def stream_response(self, system_instructions, input, model_settings, *args, **kwargs):  # type: ignore[no-untyped-def]
            async for event in super().stream_response(system_instructions, input, named(model_settings), *args, **kwargs):
                yield event

    return EpisodeModel


def episode_model(ctx: AgentContext, api: ModelAPI = "responses") -> Any:
    """An Agents SDK ``Model`` pointed at ``ctx``'s episode: the SDK's default (the Responses
    API), or its Chat Completions one (``api="chat"``)."""
    OpenAIAgentsAgent.check_installed()
    return _episode_model_class(api)(model=ctx.model, openai_client=ctx.async_openai_client())


class OpenAIAgentsAgent(FrameworkAgent):
    """An Agents SDK agent: an ``agents.Agent`` run as it is, or ``async fn(task, model) -> result``.

    Args:
        target: An ``agents.Agent`` (run with ``Runner.run``; the result is its ``final_output``),
            or an agent function whose ``model`` is an Agents SDK ``Model`` pointed at the episode.
        input: For an ``agents.Agent``: ``fn(task) -> str``, its input (default :func:`task_input`).
        max_turns: For an ``agents.Agent``: the SDK's ``max_turns`` of a run.
        name: Shown in logs.
        api: The SDK model handed out: ``"responses"`` (the SDK's default) or ``"chat"``.
    """

    extra = "openai-agents"
    modules = ("agents",)

    def __init__(
        self,
        target: Any,
        *,
        input: Callable[[Any], Any] | None = None,  # noqa: A002 - the SDK's own word
        max_turns: int | None = None,
        name: str | None = None,
        api: ModelAPI = "responses",
    ) -> None:
        if api not in ("responses", "chat"):
            raise ValueError(f"api must be 'responses' or 'chat', got {api!r}")
        self.api = api
        self.sdk_agent = target if _is_sdk_agent(target) else None
        if self.sdk_agent is not None:
            self.input = input or task_input
            self.max_turns = max_turns
            fn: Callable[..., Any] = self._run_sdk_agent
            name = name or getattr(target, "name", None)
        else:
            fn = target
        super().__init__(fn, name=name)

    async def _run_sdk_agent(self, task: Any, model: Any) -> Any:
        from agents import RunConfig, Runner

        options: dict[str, Any] = {} if self.max_turns is None else {"max_turns": self.max_turns}
        config = RunConfig(model=model, tracing_disabled=not traced())
        result = await Runner.run(self.sdk_agent, self.input(task), run_config=config, **options)
        return result.final_output

    def make_client(self, ctx: AgentContext, *, asynchronous: bool) -> Any:
        return episode_model(ctx, self.api)

    async def aclose_client(self, client: Any) -> None:
        await client._client.close()  # the AsyncOpenAI it was given

    def close_client(self, client: Any) -> None:
        # A sync agent function (Runner.run_sync): its AsyncOpenAI client belonged to the loop
        # run_sync made and closed; with the in-process transport it holds no socket. Over HTTP
        # its connections close when the client is collected: prefer an async def agent.
        pass


def _is_sdk_agent(obj: object) -> bool:
    sdk = sys.modules.get("agents")  # never import the SDK just to look
    return sdk is not None and isinstance(obj, getattr(sdk, "Agent", ()))


@hookimpl
def agentgym_adapt_agent(agent: object) -> Callable[..., Any] | None:
    if isinstance(agent, OpenAIAgentsAgent):
        return agent.as_agent()
    if _is_sdk_agent(agent):
        return OpenAIAgentsAgent(agent).as_agent()
    return None
