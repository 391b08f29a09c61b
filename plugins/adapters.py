"""The ``callable`` agent adapter: plain Python functions (sync or ``async``) are agents as they are."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from agentgym_lightning.hookspecs import hookimpl


@hookimpl(trylast=True)
def agentgym_adapt_agent(agent: object) -> Callable[..., Any] | None:
    if not callable(agent):
        return None
    try:
        inspect.signature(agent).bind(None, None)
    except TypeError:
        raise TypeError(
            f"agent {getattr(agent, '__name__', agent)!r} must accept two arguments (task, ctx); "
            "ctx is the AgentContext with the episode's base_url and clients"
        ) from None
    except ValueError:  # builtins without a signature: trust the caller
        pass
    return agent
