"""Generic AIR: a numeric or boolean outcome variable becomes a reward signal of the same name.

An agent that calls ``emit_variable("tool_error", True)`` after an LLM call gives that call the
signal ``tool_error`` with raw value 1.0; the env applies it only if ``air_weights`` names it
(``{"tool_error": -0.2}``), so it costs nothing when unused.
"""

from __future__ import annotations

from collections.abc import Mapping

from agentgym_lightning.hookspecs import hookimpl
from agentgym_lightning.trajectory import Reward, Step, Trajectory


@hookimpl
def agentgym_intermediate_rewards(step: Step, trajectory: Trajectory, weights: Mapping[str, float]) -> list[Reward]:
    rewards = []
    for name, value in step.outcome.items():
        if name in weights and isinstance(value, (bool, int, float)):
            rewards.append(Reward(value=float(value), source=name))
    return rewards
