"""The AutoGen (AgentChat) adapter: agents get an ``OpenAIChatCompletionClient`` pointed at their episode.

    from autogen_agentchat.agents import AssistantAgent
    from agentgym_lightning.plugins.autogen_adapter import AutoGenAgent

    async def math_agent(task, model_client):
        agent = AssistantAgent("solver", model_client=model_client, tools=[calculator],
                               reflect_on_tool_use=True)
        result = await agent.run(task=task["question"])
        return result.messages[-1].content

    env = AgentEnv(AutoGenAgent(math_agent), tasks, reward_fn, agent_match="solver")

Every ``model_client.create`` / ``create_stream`` is one env step; AutoGen runs its tools itself
and sends their results back as ``tool`` messages; ``model_client_stream=True`` streams through
the gateway. AutoGen is ``async`` all the way: the agent runs on the gateway's shared event loop,
no thread per agent.

**Agent names, from AutoGen's own traces.** AutoGen's client API does not say which agent calls
it, but AutoGen traces itself with OpenTelemetry (an ``invoke_agent`` span with
``gen_ai.agent.name`` around each agent's run, an ``execute_tool`` span with the tool call's id
around each tool). With the ``tracing`` extra those spans reach the episode
(:mod:`agentgym_lightning.tracing`): every call made inside an agent's run is named after it
(``step.agent``, so ``agent_match`` selects AutoGen agents), and each tool's span is a semantic
variable of the call that asked for it (``outcome["otel.tools"]``; a failing tool: the AIR signal
``otel.tool_error``). ``metadata={"agent": ...}`` still names a client's calls, and wins.

**No network.** The client only reaches the episode's gateway; AutoGen sends no telemetry of
its own (its spans reach the episode in-process; none is exported unless the program installs
an exporter).
"""

from __future__ import annotations

import re
import threading
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agentgym_lightning.framework_agent import FrameworkAgent
from agentgym_lightning.hookspecs import hookimpl

if TYPE_CHECKING:
    from agentgym_lightning.agent import AgentContext

__all__ = ["AutoGenAgent", "episode_model_client", "MODEL_INFO"]

#: What AutoGen is told about the policy: it calls tools, nothing more is assumed.
MODEL_INFO: dict[str, Any] = {
    "vision": False,
    "function_calling": True,
    "json_output": False,
    "family": "unknown",
    "structured_output": False,
    "multiple_system_messages": True,
}


def episode_model_client(ctx: AgentContext, **options: Any) -> Any:
    """An ``autogen_ext.models.openai.OpenAIChatCompletionClient`` pointed at ``ctx``'s episode.

    ``options`` are the client's own (``temperature``, ``max_tokens``, ``metadata``,
    ``model_info``...). Retries are off: a refused call is a signal, not a glitch.
    """
    AutoGenAgent.check_installed()
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    _mismatch_once(ctx.model)
    options.setdefault("model_info", MODEL_INFO)
    options.setdefault("max_retries", 0)
    return OpenAIChatCompletionClient(
        model=ctx.model,
        base_url=ctx.base_url_for_clients,
        api_key=ctx.api_key,
        http_client=ctx.async_http_client(),
        **options,
    )


#: Episode model names whose mismatch was said (a set, not Python's "once": any change to the warning
#: filters, which libraries make per call, clears the registries "once" and "default" rely on).
_MISMATCH_SAID: set[str] = set()
_MISMATCH_LOCK = threading.Lock()


def _mismatch_once(model: str) -> None:
    """Say once, and why, what AutoGen's client says on every response: "Resolved model mismatch".

    The episode tells the client a stand-in model name (``ctx.model``) and the policy answers
    under its own, so the client warns at each call (only its token and cost estimates are
    affected). Only this name's mismatch is silenced: a user's own AutoGen clients keep theirs."""
    pattern = rf"Resolved model mismatch: {re.escape(model)} != "
    with _MISMATCH_LOCK:
        if not any(f[0] == "ignore" and getattr(f[1], "pattern", None) == pattern for f in warnings.filters):
            warnings.filterwarnings("ignore", message=pattern, category=UserWarning)
        if model in _MISMATCH_SAID:
            return
        _MISMATCH_SAID.add(model)
    warnings.warn(
        f"AutoGen agents are told the model {model!r}; where the policy answers under another name, AutoGen's "
        "\"Resolved model mismatch\" warning (one a call) is expected and not shown: it only affects AutoGen's "
        "token and cost estimates",
        UserWarning,
        stacklevel=3,
    )


class AutoGenAgent(FrameworkAgent):
    """An AutoGen agent ``async fn(task, model_client) -> result``.

    Args:
        fn: The agent; ``model_client`` is an ``OpenAIChatCompletionClient`` pointed at the episode.
        name: Shown in logs.
        **client_options: ``OpenAIChatCompletionClient`` options (``temperature``, ``max_tokens``,
            ``metadata={"agent": "solver"}``...).
    """

    extra = "autogen"
    modules = ("autogen_agentchat", "autogen_ext")

    def __init__(self, fn: Callable[..., Any], *, name: str | None = None, **client_options: Any) -> None:
        super().__init__(fn, name=name)
        if not self.is_async:
            raise TypeError(f"AutoGenAgent: {self.name!r} must be an async def (AutoGen's agents are async)")
        self.client_options = client_options

    def make_client(self, ctx: AgentContext, *, asynchronous: bool) -> Any:
        return episode_model_client(ctx, **self.client_options)

    async def aclose_client(self, client: Any) -> None:
        await client.close()


@hookimpl
def agentgym_adapt_agent(agent: object) -> Callable[..., Any] | None:
    if isinstance(agent, AutoGenAgent):
        return agent.as_agent()
    return None
