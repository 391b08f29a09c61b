"""The slice of a data set's tasks an env runs (``offset=``, ``limit=``), shared by the bundled envs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

__all__ = ["slice_tasks"]


def slice_tasks(tasks: Sequence[T], split: str, offset: int = 0, limit: int | None = None) -> list[T]:
    """``tasks[offset:offset + limit]`` (``limit=None``: to the end).

    Refuses an ``offset`` outside the tasks and a ``limit`` below 1, which would leave the env
    with no tasks; ``split`` names the data in the message."""
    if offset != 0 and not 0 < offset < len(tasks):  # offset 0 leaves an empty data set to the env's own check
        raise ValueError(f"offset must be 0 to {len(tasks) - 1} ({len(tasks)} questions in {split}), got {offset}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    return list(tasks[offset:] if limit is None else tasks[offset:offset + limit])
