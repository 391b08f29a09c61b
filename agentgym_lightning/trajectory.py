"""The unified data interface: a step is one LLM call, a trajectory is one episode.

Everything an environment records, a plugin reads and a trainer consumes is one of these
dataclasses; they round-trip through JSONL with :func:`save_trajectories` /
:func:`load_trajectories` (one trajectory a line, so an interrupted run keeps every line written).

The JSONL is strict JSON (RFC 8259), readable by any parser. Values JSON cannot hold are mapped,
never allowed to fail a write: non-finite floats become the strings ``"NaN"``, ``"Infinity"``
and ``"-Infinity"`` (protobuf's JSON mapping); objects with ``to_dict()`` or ``tolist()`` are
written as what those return; non-string dict keys as ``str(key)``; anything else, a reference
cycle, or nesting deeper than 100, as a string: ``repr(obj)`` (``"<unrepresentable T>"`` when
``repr`` raises), at most 10,000 characters. A trajectory always writes; what was mapped reads
back as those strings.

A step's semantic variables are written as what changed since the previous step
(``variables_changed``, and ``variables_removed`` if a name went away), so a variable is stored
once rather than once per later step; :func:`load_trajectories` rebuilds every step's full
``variables`` snapshot, and reads files whose steps hold the whole ``variables`` as before.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import IO, Any

from agentgym_lightning.llm import ChatRequest, Completion

__all__ = [
    "Status",
    "Reward",
    "StepTimings",
    "Step",
    "Trajectory",
    "TrajectoryWriter",
    "save_trajectories",
    "load_trajectories",
    "TruncatedLineWarning",
]


class Status(str, Enum):
    """How an episode ended.

    ``TASK_FAILED`` is the agent's own fault (it raised, or produced garbage): train on it.
    ``INFRA_FAILED`` is a fault of the machinery (policy backend, gateway, reward code): never
    train on it as if it earned a zero reward.
    """

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    TASK_FAILED = "task_failed"
    INFRA_FAILED = "infra_failed"
    TRUNCATED = "truncated"


@dataclass
class Reward:
    """One reward component. ``value`` is what counts (already weighted); ``raw`` is the signal
    before its weight, kept for logging."""

    value: float
    source: str = "agent"
    raw: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"value": self.value, "source": self.source}
        if self.raw is not None:
            d["raw"] = self.raw
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Reward:
        return cls(**data)


@dataclass
class StepTimings:
    """Wall-clock times (``time.time()`` seconds) of one step."""

    requested_at: float = 0.0  #: the agent sent the request
    answered_at: float | None = None  #: the completion was handed back
    ended_at: float | None = None  #: the agent's next call arrived, or the episode ended

    def to_dict(self) -> dict[str, Any]:
        return {"requested_at": self.requested_at, "answered_at": self.answered_at, "ended_at": self.ended_at}


@dataclass
class Step:
    """One LLM call of the agent, and what followed it until its next call."""

    index: int
    request: ChatRequest
    completion: Completion | None = None
    #: Snapshot of the agent's semantic variables when it made this call.
    variables: dict[str, Any] = field(default_factory=dict)
    #: Variables the agent emitted after this call was answered (what happened: tool errors,
    #: SQL results...). AIR plugins read this.
    outcome: dict[str, Any] = field(default_factory=dict)
    rewards: list[Reward] = field(default_factory=list)
    #: False when the agent marked the call ``metadata={"trainable": "false"}``.
    trainable: bool = True
    #: Which part of the agent made the call (``metadata={"role": ...}``), if it said.
    role: str | None = None
    #: The framework's name for the agent that made the call (a LangGraph node, an Agents SDK
    #: or AutoGen agent's ``name``; ``metadata={"agent": ...}``), if it said.
    agent: str | None = None
    #: Whether ``request``'s prompt token ids extend the previous step's prompt+completion ids
    #: (``None`` when unknown). Filled in by policies that tokenize.
    prompt_extends_previous: bool | None = None
    #: True when the ids do not extend because the agent rebuilt its prompt (its messages do not
    #: continue the previous call's messages and answer): expected, not chat-template drift.
    prompt_rebuilt: bool = False
    #: The error the call was answered with instead of a completion (a backend rejected it).
    error: str | None = None
    #: Not compared: two steps are equal when they recorded the same call, whenever it ran.
    timings: StepTimings = field(default_factory=StepTimings, compare=False)

    @property
    def reward(self) -> float:
        """Sum of this step's reward components."""
        return float(sum(r.value for r in self.rewards))

    def to_dict(self, previous_variables: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The step as JSON values. With ``previous_variables`` (the previous step's, as a
        trajectory writes its steps) only what changed since is written: ``variables_changed``
        (and ``variables_removed`` when a name went away), so a big variable is stored once, not
        once per step; :meth:`Trajectory.from_dict` rebuilds every step's full snapshot."""
        if previous_variables is None:
            variables: dict[str, Any] = {"variables": self.variables}
        else:
            variables = {
                "variables_changed": {
                    k: v for k, v in self.variables.items() if not _same(previous_variables.get(k, _ABSENT), v)
                }
            }
            removed = [k for k in previous_variables if k not in self.variables]
            if removed:
                variables["variables_removed"] = removed
        return {
            "index": self.index,
            "request": self.request.to_dict(),
            "completion": self.completion.to_dict() if self.completion is not None else None,
            **variables,
            "outcome": self.outcome,
            "rewards": [r.to_dict() for r in self.rewards],
            "trainable": self.trainable,
            "role": self.role,
            "agent": self.agent,
            "prompt_extends_previous": self.prompt_extends_previous,
            "prompt_rebuilt": self.prompt_rebuilt,
            "error": self.error,
            "timings": self.timings.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Step:
        """A step from :meth:`to_dict`; alone, a ``variables_changed`` step has only those
        variables (a trajectory's steps are rebuilt in full by :meth:`Trajectory.from_dict`)."""
        data = dict(data)
        if "variables_changed" in data:
            data["variables"] = data.pop("variables_changed")
            data.pop("variables_removed", None)
        data["request"] = ChatRequest.from_dict(data["request"])
        if data.get("completion") is not None:
            data["completion"] = Completion.from_dict(data["completion"])
        data["rewards"] = [Reward.from_dict(r) for r in data.get("rewards") or []]
        data["timings"] = StepTimings(**(data.get("timings") or {}))
        return cls(**data)


@dataclass
class Trajectory:
    """One episode: the task, every LLM call, and how it ended.

    Equality compares what was recorded, not which run recorded it: ``episode_id`` and the
    wall-clock times are left out, so a replay with the same seed and actions compares equal
    (Gymnasium's ``check_env`` relies on that when an episode can end on its first step).
    """

    episode_id: str = field(compare=False)
    task: Any = None
    env_id: str | None = None
    steps: list[Step] = field(default_factory=list)
    #: The episode reward from the reward function / ``agentgym_episode_reward`` hook;
    #: ``None`` until the episode ends, and when it ended in an infrastructure failure.
    final_reward: float | None = None
    status: Status = Status.RUNNING
    error: str | None = None
    #: The agent's semantic variables at the end of the episode.
    variables: dict[str, Any] = field(default_factory=dict)
    #: Rewards the agent emitted before its first LLM call.
    rewards: list[Reward] = field(default_factory=list)
    #: What the agent callable returned.
    result: Any = None
    #: Episodes reset together on the same task share a ``group_id`` (GRPO groups).
    group_id: str | None = None
    seed: int | None = None
    started_at: float = field(default=0.0, compare=False)
    ended_at: float | None = field(default=None, compare=False)

    @property
    def done(self) -> bool:
        return self.status is not Status.RUNNING

    @property
    def total_reward(self) -> float:
        """Final reward plus every intermediate reward (what a Gymnasium return sums to)."""
        total = sum(s.reward for s in self.steps) + sum(r.value for r in self.rewards)
        return float(total + (self.final_reward or 0.0))

    @property
    def template_mismatches(self) -> int:
        """Calls that continued the previous call's conversation but whose prompt ids do not
        extend its prompt+completion ids: chat-template drift (what merged-trajectory training
        must know about)."""
        return sum(1 for s in self.steps if s.prompt_extends_previous is False and not s.prompt_rebuilt)

    @property
    def prompt_rebuilds(self) -> int:
        """Calls for which the agent rebuilt its prompt (a new conversation, as Spider's checker
        and rewriter do): their ids cannot extend the previous call's, and that is expected."""
        return sum(1 for s in self.steps if s.prompt_rebuilt)

    @property
    def trainable(self) -> bool:
        """Whether a trainer may learn from this episode (infrastructure failures it may not)."""
        return self.status is not Status.INFRA_FAILED and self.status is not Status.RUNNING

    def to_dict(self) -> dict[str, Any]:
        return {
            "episode_id": self.episode_id,
            "task": self.task,
            "env_id": self.env_id,
            "steps": self._steps_dicts(),
            "final_reward": self.final_reward,
            "status": self.status.value,
            "error": self.error,
            "variables": self.variables,
            "rewards": [r.to_dict() for r in self.rewards],
            "result": self.result,
            "group_id": self.group_id,
            "seed": self.seed,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
        }

    def _steps_dicts(self) -> list[dict[str, Any]]:
        out = []
        previous: Mapping[str, Any] = {}
        for step in self.steps:
            out.append(step.to_dict(previous))
            previous = step.variables
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        """A trajectory from :meth:`to_dict`: steps written as changes (``variables_changed``)
        get their full snapshots back; steps written whole (``variables``, older files) as they are."""
        data = dict(data)
        steps = []
        previous: dict[str, Any] = {}
        for raw in data.get("steps") or []:
            if "variables_changed" in raw:
                raw = dict(raw)
                removed = set(raw.pop("variables_removed", None) or ())
                raw["variables"] = {**{k: v for k, v in previous.items() if k not in removed}, **raw.pop("variables_changed")}
            step = Step.from_dict(raw)
            steps.append(step)
            previous = step.variables
        data["steps"] = steps
        data["status"] = Status(data.get("status", Status.RUNNING.value))
        data["rewards"] = [Reward.from_dict(r) for r in data.get("rewards") or []]
        return cls(**data)

    def to_json(self) -> str:
        """One line of strict JSON; never fails (see the module docstring for the mapping)."""
        data = self.to_dict()
        try:
            return json.dumps(data, default=_json_default, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError, RecursionError):
            # NaN/Infinity, a non-string key, a cycle, a to_dict() that raises...: map the parts
            # JSON cannot hold (slower, so only when needed).
            return json.dumps(_jsonable(data, 0, set()), ensure_ascii=False, allow_nan=False)


_ABSENT = object()


def _same(a: Any, b: Any) -> bool:
    """Whether a variable kept its value (then it is not written again)."""
    if a is b:
        return True
    if type(a) is not type(b):  # 1, 1.0 and True are equal but not the same JSON
        return False
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - an array's ambiguous truth value, a user __eq__ that raises
        return False


#: Nesting deeper than this is written as a repr; a repr is cut to this many characters.
_MAX_DEPTH = 100
_MAX_REPR = 10_000
_NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}


def _safe_repr(obj: Any) -> str:
    try:
        text = repr(obj)
    except Exception:  # noqa: BLE001 - a user object's __repr__ may raise anything
        return f"<unrepresentable {type(obj).__name__}>"
    return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 3] + "..."


def _json_default(obj: Any) -> Any:
    # Tasks and results are user objects; keep the line valid JSON whatever they are.
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return _safe_repr(obj)


def _json_key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, (bool, int, float)):
        return json.dumps(key)  # what json itself does with these keys: 1 -> "1", None -> "null"
    return _safe_repr(key)


def _jsonable(obj: Any, depth: int, seen: set[int]) -> Any:
    """``obj`` as plain JSON values (the mapping in the module docstring)."""
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else _NON_FINITE.get(obj, "NaN")
    if depth >= _MAX_DEPTH or id(obj) in seen:
        return _safe_repr(obj)
    if isinstance(obj, (Mapping, list, tuple)):
        seen.add(id(obj))
        try:
            if isinstance(obj, Mapping):
                return {_json_key(k): _jsonable(v, depth + 1, seen) for k, v in obj.items()}
            return [_jsonable(v, depth + 1, seen) for v in obj]
        finally:
            seen.discard(id(obj))
    try:
        converted = _json_default(obj)
    except Exception:  # noqa: BLE001 - a user's to_dict()/tolist() that raises
        return _safe_repr(obj)
    return converted if isinstance(converted, str) else _jsonable(converted, depth + 1, seen | {id(obj)})


class TrajectoryWriter:
    """Appends trajectories to a JSONL file, one flushed line each, so a crash loses nothing
    that was written."""

    def __init__(self, path: str | os.PathLike[str], append: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[str] = open(self.path, "a" if append else "w", encoding="utf-8")
        self.count = 0

    def write(self, trajectory: Trajectory) -> None:
        self._fh.write(trajectory.to_json() + "\n")
        self._fh.flush()
        self.count += 1

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def save_trajectories(path: str | os.PathLike[str], trajectories: Iterable[Trajectory]) -> int:
    """Write trajectories to ``path`` as JSONL; returns how many were written."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"save_trajectories(path, trajectories): path must be a file path, got {type(path).__name__} "
            "(were the arguments swapped?)"
        )
    with TrajectoryWriter(path) as writer:
        for t in trajectories:
            writer.write(t)
        return writer.count


class TruncatedLineWarning(UserWarning):
    """The last line of a trajectory file was cut off mid-write (an interrupted run)."""


def load_trajectories(path: str | os.PathLike[str]) -> Iterator[Trajectory]:
    """Read trajectories back from a JSONL file written by :func:`save_trajectories`.

    A truncated last line (a run killed mid-write) is skipped with a
    :class:`TruncatedLineWarning` naming the file and line; any other bad line raises
    :class:`ValueError` naming the file and line.
    """
    with open(path, encoding="utf-8") as fh:
        lines = fh.readlines()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            if lineno == len(lines) and not line.endswith("\n"):
                # Half-written final line of an interrupted run: the lines before it are whole.
                warnings.warn(
                    f"{path}:{lineno}: skipped a truncated last line ({len(line)} characters, no newline): "
                    "the run that wrote it was interrupted mid-write",
                    TruncatedLineWarning,
                    stacklevel=2,
                )
                return
            raise ValueError(f"{path}:{lineno}: not a JSON trajectory ({exc})") from exc
        try:
            trajectory = Trajectory.from_dict(data)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise ValueError(f"{path}:{lineno}: not a trajectory ({type(exc).__name__}: {exc})") from exc
        yield trajectory
