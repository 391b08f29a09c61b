"""The tasks of a data set an env runs, shared by the bundled envs: a seeded order (``shuffle_seed=``)
and a slice of it (``offset=``, ``limit=``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np

T = TypeVar("T")

__all__ = ["slice_tasks", "shuffle_tasks"]


def slice_tasks(tasks: Sequence[T], split: str, offset: int = 0, limit: int | None = None) -> list[T]:
    """``tasks[offset:offset + limit]`` (``limit=None``: to the end).

    Refuses an ``offset`` outside the tasks and a ``limit`` below 1, which would leave the env
    with no tasks; ``split`` names the data in the message."""
    if offset != 0 and not 0 < offset < len(tasks):  # offset 0 leaves an empty data set to the env's own check
        raise ValueError(f"offset must be 0 to {len(tasks) - 1} ({len(tasks)} questions in {split}), got {offset}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    return list(tasks[offset:] if limit is None else tasks[offset:offset + limit])


def shuffle_tasks(tasks: Sequence[T], seed: int | None) -> list[T]:
    """``tasks`` in a fixed pseudo-random order drawn from ``seed`` (``None``: their own order).

    Data files are often grouped (Spider by database), and an evaluation runs the first
    ``eval_episodes`` tasks: shuffling first makes those a sample of the whole set, and two envs
    with the same seed slice one order, so ``limit=`` and ``offset=`` still split it in two."""
    if seed is None:
        return list(tasks)
    order = np.random.default_rng(seed).permutation(len(tasks))
    return [tasks[int(i)] for i in order]
