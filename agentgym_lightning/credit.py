"""Credit assignment: share an episode's return among its LLM calls.

The strategies themselves are plugins (``agentgym_credit_strategies``); the bundled ones are in
``agentgym_lightning.plugins.credit``.
"""

from __future__ import annotations

from typing import Any

from agentgym_lightning.hookspecs import CreditStrategy
from agentgym_lightning.plugin_manager import get_plugin_manager
from agentgym_lightning.trajectory import Trajectory

__all__ = ["credit_strategies", "assign_credit"]


def credit_strategies() -> dict[str, CreditStrategy]:
    """Every strategy the loaded plugins name, by name."""
    found: dict[str, CreditStrategy] = {}
    for mapping in get_plugin_manager().hook.agentgym_credit_strategies():
        if mapping:
            found.update(mapping)
    return found


def assign_credit(trajectory: Trajectory, strategy: str = "identical", **params: Any) -> list[float]:
    """One value per step of ``trajectory`` under the named strategy."""
    strategies = credit_strategies()
    try:
        fn = strategies[strategy]
    except KeyError:
        raise ValueError(
            f"unknown credit strategy {strategy!r}; available: {', '.join(sorted(strategies))}"
        ) from None
    values = list(fn(trajectory, **params))
    if len(values) != len(trajectory.steps):
        raise RuntimeError(
            f"credit strategy {strategy!r} returned {len(values)} values for {len(trajectory.steps)} steps"
        )
    return values
