"""The ``callable`` agent adapter: plain Python functions (sync or ``async``) are agents as they are."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentgym_lightning.agent import takes_two_arguments
from agentgym_lightning.hookspecs import hookimpl


@hookimpl(trylast=True)
def agentgym_adapt_agent(agent: object) -> Callable[..., Any] | None:
    if not callable(agent):
        return None
    if not takes_two_arguments(agent):
        raise TypeError(
            f"agent {getattr(agent, '__name__', agent)!r} must accept two arguments (task, ctx); "
            "ctx is the AgentContext with the episode's base_url and clients"
        )
    return agent
