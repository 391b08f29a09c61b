"""Credit-assignment strategies: ``identical`` (LightningRL), ``discounted``, ``final-only``.

All three see an episode's rewards as: each step's own intermediate rewards ``r_t``, plus the
final reward (and rewards emitted before the first call) counted at the last step. So
``sum(final-only) == discounted(gamma=1)[0] == identical[t] == trajectory.total_reward``.
"""

from __future__ import annotations

from agentgym_lightning.hookspecs import CreditStrategy, hookimpl
from agentgym_lightning.trajectory import Trajectory


def _step_rewards(trajectory: Trajectory) -> list[float]:
    rewards = [s.reward for s in trajectory.steps]
    if rewards:
        rewards[-1] += (trajectory.final_reward or 0.0) + sum(r.value for r in trajectory.rewards)
    return rewards


def identical(trajectory: Trajectory) -> list[float]:
    """LightningRL: every LLM call of the episode gets the episode's whole return."""
    return [trajectory.total_reward] * len(trajectory.steps)


def discounted(trajectory: Trajectory, gamma: float = 0.99) -> list[float]:
    """Return-to-go ``R_t = r_t + gamma * R_{t+1}``: later rewards count less for earlier calls."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    values: list[float] = []
    running = 0.0
    for r in reversed(_step_rewards(trajectory)):
        running = r + gamma * running
        values.append(running)
    return values[::-1]


def final_only(trajectory: Trajectory) -> list[float]:
    """Each call keeps only its own intermediate rewards; the final reward goes to the last call."""
    return _step_rewards(trajectory)


@hookimpl
def agentgym_credit_strategies() -> dict[str, CreditStrategy]:
    return {"identical": identical, "discounted": discounted, "final-only": final_only}
