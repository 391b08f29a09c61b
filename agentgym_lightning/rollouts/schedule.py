"""Which tasks each training step runs: a pure function of the run's seed and the step number.

Nothing about the data position has to be saved or restored: a run resumed at step ``k`` asks
for step ``k``'s tasks and gets exactly those the interrupted run would have used.

* A list of tasks is walked in epochs: each epoch is a permutation of the whole list, seeded by
  ``(seed, epoch)``; step ``k`` takes positions ``k*B .. k*B+B-1`` of that endless sequence, so
  every task is seen once per epoch.
* A task function ``fn(rng) -> task`` (an endless generator, such as Arithmetic-v0's) is called
  ``B`` times with an RNG seeded by ``(seed, step)``.

A step that draws a varying number of tasks (``dynamic_sampling``, the pass-rate curriculum) reads
the same endless sequence through a cursor instead (:meth:`TaskSchedule.draw`): the position of the
next task, kept in the run's checkpoints. A run that draws exactly ``B`` tasks a step, none
skipped, gets the tasks of :meth:`TaskSchedule.tasks_for` in the same order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["TaskSchedule"]


class TaskSchedule:
    """Tasks of each training step (see the module docstring).

    Args:
        source: The env's tasks: a non-empty sequence, or ``fn(rng) -> task``.
        tasks_per_step: B.
        seed: The run's seed.
    """

    def __init__(self, source: Sequence[Any] | Callable[[np.random.Generator], Any], tasks_per_step: int, seed: int) -> None:
        if tasks_per_step < 1:
            raise ValueError(f"tasks_per_step must be >= 1, got {tasks_per_step}")
        if not callable(source) and len(source) == 0:
            raise ValueError("the env has no tasks to train on")
        self.source = source
        self.tasks_per_step = tasks_per_step
        self.seed = int(seed)
        self._epoch: tuple[int, np.ndarray] | None = None

    def tasks_for(self, step: int) -> list[Any]:
        """The B tasks of training step ``step`` (0-based)."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if callable(self.source):
            rng = np.random.default_rng([self.seed, step])
            return [self.source(rng) for _ in range(self.tasks_per_step)]
        return [self.task_at(position) for position in range(step * self.tasks_per_step, (step + 1) * self.tasks_per_step)]

    def task_at(self, position: int) -> Any:
        """The task at ``position`` of the endless sequence (step ``k``'s tasks are positions
        ``k*B .. k*B+B-1``; for a task function, each position is one call with its own RNG)."""
        if callable(self.source):
            return self.source(np.random.default_rng([self.seed, 1, position]))
        n = len(self.source)
        return self.source[int(self._permutation(position // n)[position % n])]

    def draw(self, cursor: int, count: int, skip: Callable[[Any], bool] | None = None) -> tuple[list[Any], int, int]:
        """``count`` tasks from ``cursor`` on, passing over those ``skip`` says to; returns them,
        the cursor after them and how many were passed over. When a whole epoch's worth of
        positions is passed over (every task skipped), the rest are taken unfiltered rather than
        searched for ever."""
        if count < 0 or cursor < 0:
            raise ValueError(f"count and cursor must be >= 0, got {count}, {cursor}")
        limit = len(self.source) if not callable(self.source) else 10_000
        out: list[Any] = []
        skipped = 0
        while len(out) < count:
            task = self.task_at(cursor)
            cursor += 1
            if skip is not None and skipped < limit and skip(task):
                skipped += 1
                continue
            out.append(task)
        return out, cursor, skipped

    def epoch_of(self, step: int) -> float:
        """How many passes over a task list step ``step`` has made (NaN for a task function)."""
        return self.epoch_at(step * self.tasks_per_step)

    def epoch_at(self, position: int) -> float:
        """How many passes over a task list the tasks before ``position`` make (NaN for a task function)."""
        if callable(self.source):
            return float("nan")
        return position / len(self.source)

    def _permutation(self, epoch: int) -> np.ndarray:
        if self._epoch is None or self._epoch[0] != epoch:
            assert not callable(self.source)
            self._epoch = (epoch, np.random.default_rng([self.seed, epoch]).permutation(len(self.source)))
        return self._epoch[1]
