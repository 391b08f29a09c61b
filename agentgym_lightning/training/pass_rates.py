"""Per-task pass rates kept across a run, and the curriculum they drive (online difficulty filtering).

A group of episodes on one task tells how often the policy solves it: its attempts and successes
(success as :func:`agentgym_lightning.metrics.succeeded` defines it: status ``succeeded`` and a
positive final reward) are added to the task's history every time the run draws it. A task the
policy always solves, or never does, carries no gradient in a GRPO group (every advantage is 0):
with ``curriculum_min_attempts`` N > 0, once a task has N attempts it is no longer drawn while its
pass rate lies outside ``[curriculum_min_pass_rate, curriculum_max_pass_rate]`` (arXiv 2504.03380;
prime-rl's online difficulty filtering).

Tasks are told apart by :func:`task_key`: their ``id`` when they have one, else a hash of their
JSON. The trainer keeps it for a task list (a task function's tasks never come again, so it would
only grow). The history goes into every checkpoint (:meth:`PassRates.state`), so a resumed run filters
exactly as the interrupted one would have. :func:`load_task_file` reads a task list with measured
pass rates (``agentgym-lightning eval --pass-rates FILE`` writes one, measured with one policy;
``agentgym-lightning pass-rates RUN`` writes one from the episodes a run already has): the run
trains on those tasks, their history seeded from the file. A file may name its tasks by key alone
(``pass-rates --keys-only``), looked up among the env's tasks: a measured pool that copies no
dataset text, small enough to keep beside the code.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym_lightning.metrics import succeeded
from agentgym_lightning.training.dynamic_sampling import split_groups
from agentgym_lightning.trajectory import Status, Trajectory

__all__ = ["PassRates", "task_key", "load_task_file", "write_pass_rates", "group_pass_counts", "task_pass_counts", "is_task_file", "read_task_counts"]


def task_key(task: Any) -> str:
    """A stable name for ``task``: its ``id`` (a mapping's ``"id"`` or ``"task_id"``), else the
    SHA-1 of its JSON with sorted keys."""
    if isinstance(task, Mapping):
        for name in ("id", "task_id"):
            value = task.get(name)
            if isinstance(value, (str, int)) and not isinstance(value, bool):
                return f"{name}:{value}"
    text = json.dumps(task, sort_keys=True, default=repr, ensure_ascii=False)
    return "sha1:" + hashlib.sha1(text.encode("utf-8")).hexdigest()[:20]


def group_pass_counts(trajectories: Sequence[Trajectory]) -> tuple[int, int]:
    """``(attempts, successes)`` of one task's episodes; infrastructure failures and unfinished
    episodes are not attempts (the policy was never judged on them)."""
    judged = [t for t in trajectories if t.status is not Status.INFRA_FAILED and t.status is not Status.RUNNING]
    return len(judged), sum(1 for t in judged if succeeded(t))


def task_pass_counts(trajectories: Sequence[Trajectory]) -> dict[str, tuple[Any, int, int]]:
    """Each task's ``(task, attempts, successes)`` by :func:`task_key`, its groups' counts added (a
    task drawn in several groups, or evaluated more than once), in the order of the tasks' first
    groups by seed (:func:`~.dynamic_sampling.split_groups`): the same however the episodes finished."""
    counts: dict[str, tuple[Any, int, int]] = {}
    for group in split_groups(trajectories):
        key = task_key(group[0].task)
        attempts, successes = group_pass_counts(group)
        task, seen, solved = counts.get(key, (group[0].task, 0, 0))
        counts[key] = (task, seen + attempts, solved + successes)
    return counts


@dataclass
class _Record:
    attempts: int = 0
    successes: int = 0

    @property
    def rate(self) -> float:
        return self.successes / self.attempts if self.attempts else math.nan


class PassRates:
    """Each task's attempts and successes over the run, and the curriculum's filter on them.

    Args:
        min_attempts: Attempts before a task may be filtered (0: never filtered).
        min_rate: A task solved less often than this (after ``min_attempts``) is not drawn again.
        max_rate: A task solved more often than this (after ``min_attempts``) is not drawn again.
    """

    def __init__(self, min_attempts: int = 0, min_rate: float = 0.0, max_rate: float = 1.0) -> None:
        if min_attempts < 0 or not 0.0 <= min_rate <= max_rate <= 1.0:
            raise ValueError(f"need min_attempts >= 0 and 0 <= min_rate <= max_rate <= 1; got {min_attempts}, {min_rate}, {max_rate}")
        self.min_attempts, self.min_rate, self.max_rate = min_attempts, min_rate, max_rate
        self._records: dict[str, _Record] = {}

    def __len__(self) -> int:
        return len(self._records)

    def record(self, task: Any, attempts: int, successes: int) -> None:
        """Add a group's ``attempts`` and ``successes`` to ``task``'s history."""
        if not 0 <= successes <= attempts:
            raise ValueError(f"successes must be within 0..attempts; got {successes} of {attempts}")
        if attempts:
            record = self._records.setdefault(task_key(task), _Record())
            record.attempts += attempts
            record.successes += successes

    def record_group(self, trajectories: Sequence[Trajectory]) -> None:
        """Add one task's group of episodes (they share ``trajectories[0].task``)."""
        if trajectories:
            self.record(trajectories[0].task, *group_pass_counts(trajectories))

    def rate(self, task: Any) -> float:
        """``task``'s pass rate so far (NaN before its first attempt)."""
        record = self._records.get(task_key(task))
        return record.rate if record is not None else math.nan

    def attempts(self, task: Any) -> int:
        record = self._records.get(task_key(task))
        return record.attempts if record is not None else 0

    def filtered(self, task: Any) -> bool:
        """Whether the curriculum no longer draws ``task``: it has ``min_attempts`` attempts and a
        pass rate outside ``[min_rate, max_rate]``."""
        if not self.min_attempts:
            return False
        record = self._records.get(task_key(task))
        if record is None or record.attempts < self.min_attempts:
            return False
        return record.rate < self.min_rate or record.rate > self.max_rate

    def metrics(self) -> dict[str, float]:
        """``curriculum/...``: tasks with a history, and how many the filter holds back as too
        easy (above ``max_rate``) or too hard (below ``min_rate``)."""
        seasoned = [r for r in self._records.values() if self.min_attempts and r.attempts >= self.min_attempts]
        return {
            "curriculum/tasks_seen": float(len(self._records)),
            "curriculum/tasks_too_easy": float(sum(1 for r in seasoned if r.rate > self.max_rate)),
            "curriculum/tasks_too_hard": float(sum(1 for r in seasoned if r.rate < self.min_rate)),
        }

    def state(self) -> dict[str, list[int]]:
        """What a checkpoint keeps: task key -> ``[attempts, successes]``."""
        return {key: [r.attempts, r.successes] for key, r in self._records.items()}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Take a checkpoint's :meth:`state` back (replacing the history)."""
        records: dict[str, _Record] = {}
        for key, value in state.items():
            attempts, successes = (int(v) for v in value)
            if not 0 <= successes <= attempts:
                raise ValueError(f"a checkpoint's pass rate for {key!r} is not a count: {value!r}")
            records[str(key)] = _Record(attempts, successes)
        self._records = records


def _task_file_rows(path: Path) -> Iterator[tuple[int, Mapping[str, Any], int, int]]:
    """``(line number, row, attempts, successes)`` of each line of a task file, checked: errors name the file and line."""
    with path.open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno} is not JSON ({exc.msg}): each line is {{\"task\": ...}}") from None
            if not isinstance(row, Mapping) or ("task" not in row and not isinstance(row.get("key"), str)):
                raise ValueError(
                    f"{path}:{lineno} has no \"task\": each line is {{\"task\": ..., \"attempts\": k, \"successes\": s}} "
                    "or names its task with {\"key\": ...}"
                )
            attempts, successes = row.get("attempts", 0), row.get("successes", 0)
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (attempts, successes)) or not 0 <= successes <= attempts:
                raise ValueError(f"{path}:{lineno}: attempts and successes must be counts with successes <= attempts; got {attempts!r}, {successes!r}")
            yield lineno, row, attempts, successes


def load_task_file(path: str | Path, pass_rates: PassRates | None = None, tasks: Sequence[Any] | None = None) -> list[Any]:
    """The tasks of a task file (JSONL, one ``{"task": ..., "attempts": k, "successes": s}`` a
    line; the counts optional), their counts added to ``pass_rates``. Errors name the file and line.

    A line may name its task by ``"key"`` alone (:func:`task_key`; ``pass-rates --keys-only``
    writes such files, which hold no dataset text and so can be kept in a repository): it is looked
    up among ``tasks``, the env's own, and a key they do not hold is an error."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"task_file {path} is not a file: write one with `agentgym-lightning eval --pass-rates {path}`")
    by_key: dict[str, Any] | None = None
    chosen: list[Any] = []
    for lineno, row, attempts, successes in _task_file_rows(path):
        if "task" in row:
            task = row["task"]
        else:
            if by_key is None:
                by_key = {task_key(t): t for t in (tasks or ())}
            if row["key"] not in by_key:
                raise ValueError(
                    f"{path}:{lineno}: the env has no task with key {row['key']!r} ({len(by_key)} tasks): a file of keys "
                    "is read against the env it was measured on; train with that env's options (its data and split)"
                )
            task = by_key[row["key"]]
        chosen.append(task)
        if pass_rates is not None:
            pass_rates.record(task, attempts, successes)
    if not chosen:
        raise ValueError(f"task_file {path} holds no tasks")
    return chosen


def is_task_file(path: str | Path) -> bool:
    """Whether ``path`` is a task file (its first line a task's counts) rather than a trajectory file."""
    try:
        with Path(path).open(encoding="utf-8") as handle:
            row = json.loads(next((line for line in handle if line.strip()), ""))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False  # not a task file; read as episodes, whose reader names the bad line
    return isinstance(row, Mapping) and "attempts" in row and "steps" not in row and ("task" in row or "key" in row)


def read_task_counts(path: str | Path) -> list[dict[str, Any]]:
    """A task file's lines as ``{"key", "attempts", "successes"}`` (and ``"task"`` where the line has
    it), no env needed: what ``pass-rates`` merges. Errors name the file and line."""
    path = Path(path)
    rows = []
    for _, row, attempts, successes in _task_file_rows(path):
        counted = {"key": row["key"] if isinstance(row.get("key"), str) else task_key(row["task"]), "attempts": attempts, "successes": successes}
        if "task" in row:
            counted["task"] = row["task"]
        rows.append(counted)
    return rows


#: The task of a row counted from a file of keys: its text is not known.
_NO_TASK: Any = object()


def write_pass_rates(
    path: str | Path, trajectories: Sequence[Trajectory], *, keys_only: bool = False, counted: Sequence[Mapping[str, Any]] = ()
) -> list[dict[str, Any]]:
    """Write each task of ``trajectories`` as one line of a task file:
    ``{"task", "key", "attempts", "successes", "pass_rate"}``, in the order the tasks first come;
    returns the rows. A task met in several groups (a run that drew it again) gets one line, their
    counts added. ``counted``: rows already counted (:func:`read_task_counts` of other task files),
    added the same way, so task files merge. ``train --set task_file=PATH`` trains on these tasks,
    their counts seeding the curriculum's history. With ``keys_only`` the lines leave ``"task"``
    out: ``train`` then looks each key up among its env's tasks (a file that holds no dataset
    text); without it, a task known by its key alone is a ``ValueError``."""
    path = Path(path)
    rows: dict[str, dict[str, Any]] = {}

    def add(key: str, task: Any, attempts: int, successes: int) -> None:
        row = rows.setdefault(key, {"task": task, "key": key, "attempts": 0, "successes": 0})
        if row["task"] is _NO_TASK:
            row["task"] = task
        row["attempts"] += attempts
        row["successes"] += successes

    for key, (task, attempts, successes) in task_pass_counts(trajectories).items():
        add(key, task, attempts, successes)
    for c in counted:
        add(c["key"], c.get("task", _NO_TASK), c["attempts"], c["successes"])
    unnamed = [key for key, row in rows.items() if row["task"] is _NO_TASK]
    if unnamed and not keys_only:
        raise ValueError(
            f"{len(unnamed)} task(s) are known by their key alone (e.g. {unnamed[0]!r}, from a task file of keys): "
            "write the merge with --keys-only, or give the episodes that hold their text"
        )
    for row in rows.values():
        row["pass_rate"] = row["successes"] / row["attempts"] if row["attempts"] else None
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for row in rows.values():
            line = {k: v for k, v in row.items() if k != "task"} if keys_only else row
            handle.write(json.dumps(line, ensure_ascii=False, default=repr) + "\n")
    return [{k: v for k, v in row.items() if v is not _NO_TASK} for row in rows.values()]

