"""Dynamic sampling (DAPO's ``filter_groups``): a step trains on groups whose rewards vary.

A GRPO group whose episodes all earned the same reward has every advantage 0: it costs its rollouts
and teaches nothing. With ``dynamic_sampling`` a step keeps drawing new tasks until it holds
``tasks_per_step`` groups with signal (:func:`group_has_signal`), or until ``max_sampling_rounds``
draws are spent:

* **Rounds.** The first round draws ``B`` tasks. Each later one draws the tasks still missing,
  divided by the share of groups that have had signal so far in the run (at least 1/4 of it, so
  one bad round does not draw an epoch), at most ``4 B``. A round runs as one rollout (in this
  process or on Ray workers alike), so its groups batch together.
* **What trains.** The first ``B`` groups with signal, round by round, a round's groups in the
  order of their episodes' seeds (not of which finished first: a resumed run picks the same). Groups without signal
  are dropped (``sampling/groups_zero_variance``); groups with signal past ``B`` are the surplus of
  an overdrawn round (``sampling/groups_surplus``), not trained: the next step's policy would be
  newer than the one that sampled them. Every drawn episode is written to the step's trajectory
  file all the same, so nothing is lost and the viewer shows what was dropped.
* **The bound.** When ``max_sampling_rounds`` draws leave fewer than ``B`` groups with signal, the
  step trains on what it has and says so (``sampling/bound_hit`` 1).

With ``max_staleness`` >= 1 the producer's finished groups are filtered as the step takes them
(:meth:`agentgym_lightning.rollouts.async_rollouts.AsyncRollouts.take`), and every dropped group
lets the producer run one group further ahead.

"Rewards vary" means the episodes' returns differ (the same test as the update's zero-variance
groups). Under ``outcome_first`` a group whose final rewards differ comes first; a group told apart
by its shaping alone (AIR breaking a tie of outcomes) is held back and trains only where the rounds
end with fewer than ``B`` groups of the first kind (``sampling/groups_shaping_only``): a policy that
solves nothing yet, as the main job's base model, learns from shaping alone, and once outcomes vary
the outcome decides.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentgym_lightning.training.shaping import outcomes_vary
from agentgym_lightning.trajectory import Trajectory

__all__ = ["group_has_signal", "shaping_only", "split_groups", "DynamicSampler", "Filled"]

#: Returns closer than this are equal (samples.py's tie).
_TIE = 1e-9
#: The least share of groups with signal a later round assumes (it bounds a round's size).
_MIN_KEEP_RATE = 0.25
#: A round draws at most this many times ``tasks_per_step`` tasks.
_MAX_ROUND_FACTOR = 4


def group_has_signal(trajectories: Sequence[Trajectory], outcome_only: bool = False) -> bool:
    """Whether one task's group can teach anything: at least two of its episodes were judged
    (not infrastructure failures, not unfinished) and their returns (``outcome_only``: final
    rewards) are not all equal."""
    judged = [t for t in trajectories if t.trainable]
    if len(judged) < 2:
        return False
    if outcome_only:
        return outcomes_vary(judged)
    returns = [t.total_reward for t in judged]
    return max(returns) - min(returns) > _TIE


def shaping_only(trajectories: Sequence[Trajectory]) -> bool:
    """Whether a group's returns vary although its final rewards do not (its shaping alone tells
    the episodes apart)."""
    return group_has_signal(trajectories) and not group_has_signal(trajectories, outcome_only=True)


def split_groups(trajectories: Sequence[Trajectory]) -> list[list[Trajectory]]:
    """``trajectories`` as groups (``group_id``; an episode without one alone), each group's
    episodes in seed order and the groups in the order of their first seeds: the same groups in
    the same order however the episodes finished (a resumed run keeps the same ones)."""
    groups: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        groups.setdefault(t.group_id if t.group_id is not None else f"episode:{t.episode_id}", []).append(t)
    ordered = [sorted(members, key=lambda t: t.seed or 0) for members in groups.values()]
    return sorted(ordered, key=lambda members: members[0].seed or 0)


@dataclass
class Filled:
    """What :meth:`DynamicSampler.fill` gathered for one step."""

    #: The groups the step trains on (at most ``tasks_per_step``), in the order kept.
    kept: list[list[Trajectory]] = field(default_factory=list)
    #: Every group drawn, round by round (the kept ones among them).
    drawn: list[list[Trajectory]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def trajectories(self) -> list[Trajectory]:
        """The kept groups' episodes."""
        return [t for group in self.kept for t in group]


class DynamicSampler:
    """Draws rounds of tasks until a step has ``tasks_per_step`` groups with signal.

    Args:
        tasks_per_step: B, the groups a step trains on.
        max_rounds: The draws a step may make (``max_sampling_rounds``).
        outcome_only: Signal is a spread of final rewards (``outcome_first``), not of returns.
        enabled: False: one round of B tasks, every group kept (the plain loop, counted the same way).
    """

    def __init__(self, tasks_per_step: int, max_rounds: int, *, outcome_only: bool = False, enabled: bool = True) -> None:
        if tasks_per_step < 1 or max_rounds < 1:
            raise ValueError(f"tasks_per_step and max_rounds must be >= 1; got {tasks_per_step}, {max_rounds}")
        self.tasks_per_step, self.max_rounds = tasks_per_step, max_rounds if enabled else 1
        self.outcome_only, self.enabled = outcome_only, enabled
        #: Groups drawn and groups with signal over the run (the later rounds' size; checkpointed).
        self.groups_drawn_total = 0
        self.groups_with_signal_total = 0

    def round_size(self, missing: int, first: bool) -> int:
        """Tasks a round draws when ``missing`` groups with signal are still wanted."""
        if first or not self.enabled:
            return missing
        rate = self.groups_with_signal_total / self.groups_drawn_total if self.groups_drawn_total else 1.0
        return min(math.ceil(missing / max(rate, _MIN_KEEP_RATE)), _MAX_ROUND_FACTOR * self.tasks_per_step)

    def fill(self, run_round: Callable[[int, int], Sequence[Trajectory]]) -> Filled:
        """Call ``run_round(round_index, tasks)`` (which draws that many new tasks, runs their
        groups and returns the finished episodes) until B groups with signal are in hand or the
        rounds are spent; returns them and the step's ``sampling/`` metrics."""
        filled = Filled()
        dropped = rounds = 0
        with_signal: list[list[Trajectory]] = []
        held_back: list[list[Trajectory]] = []  # outcome_only: told apart by shaping alone
        while rounds < self.max_rounds and len(with_signal) < self.tasks_per_step:
            count = self.round_size(self.tasks_per_step - len(with_signal), first=rounds == 0)
            groups = split_groups(run_round(rounds, count))
            rounds += 1
            for group in groups:
                filled.drawn.append(group)
                signal = group_has_signal(group, self.outcome_only)
                self.groups_drawn_total += 1
                self.groups_with_signal_total += int(signal)
                if signal or not self.enabled:  # disabled: every group trains (the update skips those that tie)
                    with_signal.append(group)
                elif self.outcome_only and shaping_only(group):
                    held_back.append(group)
                else:
                    dropped += 1
        filled.kept = with_signal[: self.tasks_per_step]
        shaping = held_back[: self.tasks_per_step - len(filled.kept)]
        filled.kept += shaping
        dropped += len(held_back) - len(shaping)
        filled.metrics = {
            "sampling/rounds": float(rounds),
            "sampling/groups_drawn": float(len(filled.drawn)),
            "sampling/groups_zero_variance": float(dropped),
            "sampling/groups_kept": float(len(filled.kept)),
            "sampling/groups_surplus": float(max(len(with_signal) - self.tasks_per_step, 0)),
            "sampling/groups_shaping_only": float(len(shaping)),
            "sampling/bound_hit": float(self.enabled and len(with_signal) < self.tasks_per_step),
        }
        return filled

    def state(self) -> dict[str, int]:
        """What a checkpoint keeps: the run's counts (a resumed run sizes its rounds the same)."""
        return {"groups_drawn_total": self.groups_drawn_total, "groups_with_signal_total": self.groups_with_signal_total}

    def restore(self, state: dict[str, Any]) -> None:
        self.groups_drawn_total = int(state.get("groups_drawn_total", 0))
        self.groups_with_signal_total = int(state.get("groups_with_signal_total", 0))
