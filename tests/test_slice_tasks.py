"""``slice_tasks``: the ``offset=``/``limit=`` slice every bundled env takes of its data set."""

import pytest

from agentgym_lightning.envs.tasks import shuffle_tasks, slice_tasks


def test_slices_and_refuses_what_would_leave_no_tasks():
    tasks = ["a", "b", "c", "d"]
    assert slice_tasks(tasks, "dev") == tasks
    assert slice_tasks(tasks, "dev", limit=2) == ["a", "b"]
    assert slice_tasks(tasks, "dev", offset=1, limit=2) == ["b", "c"]
    assert slice_tasks(tasks, "dev", offset=3, limit=10) == ["d"]
    for offset in (-1, 4):
        with pytest.raises(ValueError, match=rf"offset must be 0 to 3 \(4 questions in dev\), got {offset}"):
            slice_tasks(tasks, "dev", offset=offset)
    with pytest.raises(ValueError, match="limit must be at least 1, got 0"):
        slice_tasks(tasks, "dev", limit=0)


def test_shuffle_is_a_fixed_permutation_per_seed():
    tasks = list(range(50))
    assert shuffle_tasks(tasks, None) == tasks
    once = shuffle_tasks(tasks, 0)
    assert sorted(once) == tasks and once != tasks
    assert shuffle_tasks(tasks, 0) == once  # the same on every call (and machine: numpy's PCG64)
    assert shuffle_tasks(tasks, 1) != once
    assert shuffle_tasks([], 0) == []
