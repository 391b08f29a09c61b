"""Two evaluations of the same held-out tasks, compared task by task: did the model beat the base?

A held-out score moves by a few tasks between evaluations of equally good policies, so "12/96
against 9/96" says little alone. Both evaluations ran the *same* tasks, so the comparison is
paired: a task *won* is one the model solves more often than the base did, a task *lost* the other
way round, and the tasks both solve (or both fail) equally say nothing about which is better. The
sign test asks how likely as many wins or more would be if each changed task were a fair coin
(exact binomial, no approximation: the counts are small). Several pairs (one per seed) pool their
wins and losses, each seed's tasks counted as independent draws.

Tasks are matched by :func:`~agentgym_lightning.training.pass_rates.task_key`; success is
:func:`~agentgym_lightning.metrics.succeeded` (what ``success_rate`` counts). A task run several
times in an evaluation (``eval --group-size k``) is compared by its share of successes.
``agentgym-lightning compare`` prints it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from agentgym_lightning.training.pass_rates import task_pass_counts
from agentgym_lightning.trajectory import Trajectory

__all__ = ["PairedComparison", "compare_paired", "pool", "sign_test_p"]


@dataclass(frozen=True)
class PairedComparison:
    """The model's evaluation against the base's, on the tasks both ran."""

    tasks: int
    """Tasks in both evaluations (the others are counted in ``only_base`` / ``only_model``)."""
    base_solved: float
    """Sum over those tasks of the base's share of successes (for greedy runs: tasks solved)."""
    model_solved: float
    """The same for the model."""
    won: int
    """Tasks the model solved more often than the base."""
    lost: int
    """Tasks the base solved more often than the model."""
    only_base: int = 0
    only_model: int = 0

    @property
    def p_better(self) -> float:
        """One-sided sign-test p-value that the model is better: P(wins >= ``won``) under no difference."""
        return sign_test_p(self.won, self.lost)

    @property
    def p_different(self) -> float:
        """Two-sided sign-test p-value (either direction)."""
        return min(1.0, 2 * min(sign_test_p(self.won, self.lost), sign_test_p(self.lost, self.won)))


def sign_test_p(won: int, lost: int) -> float:
    """P(X >= ``won``) for X ~ Binomial(``won + lost``, 1/2): the exact one-sided sign test (1.0 when no task changed)."""
    if won < 0 or lost < 0:
        raise ValueError(f"won and lost are counts; got {won}, {lost}")
    n = won + lost
    return sum(math.comb(n, i) for i in range(won, n + 1)) / 2**n


def _shares(episodes: Sequence[Trajectory]) -> dict[str, float]:
    """Each task's share of successes among its judged episodes (tasks with none judged left out)."""
    return {key: successes / attempts for key, (_, attempts, successes) in task_pass_counts(episodes).items() if attempts}


def compare_paired(base: Sequence[Trajectory], model: Sequence[Trajectory]) -> PairedComparison:
    """The model's episodes against the base's, task by task. ``ValueError`` when the two share no
    judged task (different splits, seeds or envs: nothing to pair)."""
    a, b = _shares(base), _shares(model)
    both = a.keys() & b.keys()
    if not both:
        raise ValueError(
            f"the two evaluations share no task ({len(a)} and {len(b)} judged): compare evaluations of the same "
            "held-out tasks (the same env, split, shuffle and --seed)"
        )
    return PairedComparison(
        tasks=len(both),
        base_solved=sum(a[k] for k in both),
        model_solved=sum(b[k] for k in both),
        won=sum(1 for k in both if b[k] > a[k]),
        lost=sum(1 for k in both if b[k] < a[k]),
        only_base=len(a.keys() - both),
        only_model=len(b.keys() - both),
    )


def pool(comparisons: Sequence[PairedComparison]) -> PairedComparison:
    """Several pairs (e.g. one a seed) as one: tasks, solved counts, wins and losses added."""
    if not comparisons:
        raise ValueError("nothing to pool: give at least one comparison")
    return PairedComparison(
        tasks=sum(c.tasks for c in comparisons),
        base_solved=sum(c.base_solved for c in comparisons),
        model_solved=sum(c.model_solved for c in comparisons),
        won=sum(c.won for c in comparisons),
        lost=sum(c.lost for c in comparisons),
        only_base=sum(c.only_base for c in comparisons),
        only_model=sum(c.only_model for c in comparisons),
    )
