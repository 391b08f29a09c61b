"""Outcome first: shaping rewards that cannot outrank the outcome (``outcome_first``).

An episode's **outcome** is its final reward (``Trajectory.final_reward``: the env's verdict, a
judge's score, what ``eval/reward`` measures). Its **shaping** is every other reward it collected:
AIR on its calls (:mod:`agentgym_lightning.air`), rewards the agent emitted along the way. Shaping
that pays for activity gets learned instead of the task (docs/experiments.md: every variant where
AIR fired; SimpleRL-Zoo, Arctic-Text2SQL-R1), so under ``outcome_first`` it only breaks ties.

**The rule**, applied within each group (one task's episodes) before credit assignment. Let ``δ``
be the smallest positive difference between two of the group's outcomes. Every episode whose
shaping total ``s`` has ``|s| >= δ/2`` has each of its shaping rewards multiplied by
``c = (δ/2)(1 - 1e-3) / |s|``, so afterwards ``|s| < δ/2`` for every episode. Two episodes whose
outcomes differ then differ by at least ``δ > |s_i| + |s_j|`` in outcome, so their returns keep
the outcomes' order: a failed episode never outscores a solved one, however much shaping it
collected. Where every outcome of the group ties (``δ`` undefined), shaping is left whole: it is
the only thing telling the episodes apart, and only there does it decide the advantage's sign.
The outcome itself is never changed, nor is a call's shaping moved to another call, so per-call
credit strategies (``discounted``, ``final-only``) see the same shape, scaled.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence

from agentgym_lightning.trajectory import Reward, Trajectory

__all__ = ["outcome_first", "outcome", "shaping", "outcomes_vary"]

#: How far below half the outcome gap the shaping is held (strictly inside the bound).
_MARGIN = 1e-3
#: Outcomes closer than this are equal.
_TIE = 1e-9


def outcome(trajectory: Trajectory) -> float:
    """The episode's final reward (0 when it has none)."""
    return float(trajectory.final_reward or 0.0)


def shaping(trajectory: Trajectory) -> float:
    """The episode's rewards besides its final one (AIR, rewards emitted along the way)."""
    return trajectory.total_reward - outcome(trajectory)


def outcomes_vary(trajectories: Sequence[Trajectory]) -> bool:
    """Whether the episodes' final rewards are not all equal."""
    values = [outcome(t) for t in trajectories]
    return bool(values) and max(values) - min(values) > _TIE


def outcome_first(trajectories: Sequence[Trajectory]) -> list[Trajectory]:
    """``trajectories`` with their shaping scaled as the module docstring's rule says, group by
    group (``group_id``; an episode without one is its own group); the episodes whose shaping is
    scaled are copies, the rest are returned as they are, in the order given."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(trajectories):
        groups[t.group_id if t.group_id is not None else f"episode:{t.episode_id}"].append(i)
    out = list(trajectories)
    for members in groups.values():
        outcomes = sorted({round(outcome(trajectories[i]), 12) for i in members})
        gaps = [b - a for a, b in zip(outcomes, outcomes[1:]) if b - a > _TIE]
        if not gaps:
            continue  # the outcomes tie: shaping breaks the tie, whole
        bound = min(gaps) / 2 * (1 - _MARGIN)
        for i in members:
            total = shaping(trajectories[i])
            if abs(total) >= bound:
                out[i] = _scaled(trajectories[i], bound / abs(total))
    return out


def _scaled(trajectory: Trajectory, factor: float) -> Trajectory:
    """A copy of ``trajectory`` whose shaping rewards are multiplied by ``factor``."""

    def scale(rewards: list[Reward]) -> list[Reward]:
        return [dataclasses.replace(r, value=r.value * factor) for r in rewards]

    steps = [dataclasses.replace(s, rewards=scale(s.rewards)) for s in trajectory.steps]
    return dataclasses.replace(trajectory, steps=steps, rewards=scale(trajectory.rewards))
