"""Automatic Intermediate Rewards (AIR): a call's signals, weighed into rewards on its step.

When a step is complete (the agent's next call arrived, or the episode ended), the
``agentgym_intermediate_rewards`` hook turns what happened after the call (its ``outcome``: tool
errors, SQL results, the tracing join's ``otel.*`` counts) into raw signals, each a
:class:`~agentgym_lightning.trajectory.Reward` named by its source. The env's ``air_weights`` say
which sources count and how much (``{"tool_error": -0.1}``): a signal is multiplied by its
source's weight, and one whose source has no weight is dropped, so AIR is off by default.

A weighed signal is a reward entering the episode like any other, so it passes
:func:`~agentgym_lightning.reward_bounds.checked_reward`: one that is refused never lands, and
its message excludes the episode (:meth:`~agentgym_lightning.episode.Episode.add_air`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentgym_lightning.reward_bounds import RewardRefused, checked_reward
from agentgym_lightning.trajectory import Reward, Step, Trajectory

__all__ = ["AirRewards", "air_rewards", "weigh_signals"]


@dataclass
class AirRewards:
    """A step's AIR: the weighed rewards to add to it, and why any were refused."""

    rewards: list[Reward] = field(default_factory=list)
    #: One message per refused reward (see :mod:`~agentgym_lightning.reward_bounds`), in order.
    refused: list[str] = field(default_factory=list)


def weigh_signals(signals: Iterable[Reward | Iterable[Reward] | None], weights: Mapping[str, float], owner: str) -> AirRewards:
    """Apply ``weights`` to ``signals`` (what each ``agentgym_intermediate_rewards``
    implementation returned: a reward, several, or ``None``). ``owner`` names the env in a
    refusal's message. Each kept reward records its raw signal (``Reward.raw``)."""
    air = AirRewards()
    for result in signals:
        for raw in [result] if isinstance(result, Reward) else list(result or []):
            weight = weights.get(raw.source)
            if weight is None:
                continue
            try:
                value = checked_reward(raw.value * weight, f"AIR source {raw.source!r} of {owner}")
            except RewardRefused as exc:
                air.refused.append(str(exc))
                continue
            air.rewards.append(Reward(value=value, source=raw.source, raw=raw.value))
    return air


def air_rewards(hook: Any, step: Step, trajectory: Trajectory, weights: Mapping[str, float], owner: str) -> AirRewards:
    """The AIR of a complete ``step``: ask the ``agentgym_intermediate_rewards`` implementations
    of ``hook`` (the plugin manager's hook relay) for its signals and weigh them (:func:`weigh_signals`)."""
    return weigh_signals(hook.agentgym_intermediate_rewards(step=step, trajectory=trajectory, weights=weights), weights, owner)
