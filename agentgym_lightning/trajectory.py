"""The unified data interface: a step is one LLM call, a trajectory is one episode.

Everything an environment records, a plugin reads and a trainer consumes is one of these
dataclasses; they round-trip through JSONL with :func:`save_trajectories` /
:func:`load_trajectories` (one trajectory a line, so an interrupted run keeps every line written).

A file stores each call once: a step's request keeps only the messages it adds to the previous
step's request of the same episode (and its tools and prompt token ids only where they differ);
the step's ``"from_previous"`` says how much it took from the previous step, e.g.
``{"messages": 5, "tools": true, "prompt_token_ids": 812}``, and the loader rebuilds the full
request exactly. Its semantic variables likewise: only those that changed since the previous
step (``variables_changed``, and ``variables_removed`` if a name went away), so a big variable is
stored once, not once per step. Files written before this format (every step whole) load the
same way.

The JSONL is strict JSON (RFC 8259), readable by any parser. Values JSON cannot hold are mapped,
never allowed to fail a write: non-finite floats become the strings ``"NaN"``, ``"Infinity"``
and ``"-Infinity"`` (protobuf's JSON mapping); objects with ``to_dict()`` or ``tolist()`` are
written as what those return; non-string dict keys as ``str(key)``; anything else, a reference
cycle, or nesting deeper than 100, as a string: ``repr(obj)`` (``"<unrepresentable T>"`` when
``repr`` raises), at most 10,000 characters. A trajectory always writes; what was mapped reads
back as those strings.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import IO, Any

from agentgym_lightning.llm import ChatRequest, Completion, common_prefix_length
from agentgym_lightning.run_files import LONG_LINE, MAX_LINE_BYTES, RunFileError, iter_lines, open_run_file

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
    "SkippedLineWarning",
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
        reward = cls(**data)
        _check_number("a reward's value", reward.value)
        return reward


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
    #: Whether the call trains, as its episode judged it (:meth:`~agentgym_lightning.episode.Episode.judge`):
    #: False when the agent marked it ``metadata={"trainable": "false"}``, it was answered with an
    #: error, or the env's ``agent_match`` rejected it.
    trainable: bool = True
    #: Which part of the agent made the call (``metadata={"role": ...}``), if it said.
    role: str | None = None
    #: The framework's name for the agent that made the call (a LangGraph node, an Agents SDK
    #: or AutoGen agent's ``name``; ``metadata={"agent": ...}``), if it said.
    agent: str | None = None
    #: Whether ``request``'s prompt token ids extend the previous step's prompt+completion ids
    #: (``None`` when unknown: no token ids). The episode records it as the call is answered.
    prompt_extends_previous: bool | None = None
    #: True when the ids do not extend because the agent rebuilt its prompt (its messages do not
    #: continue the previous call's messages and answer): expected, not chat-template drift.
    prompt_rebuilt: bool = False
    #: The error the call was answered with instead of a completion (a backend rejected it).
    error: str | None = None
    #: The policy version that answered the call: the number of updates the generator's weights
    #: had seen when the call was handed to it (asynchronous training: ``max_staleness``). ``None``
    #: outside training.
    policy_version: int | None = None
    #: Not compared: two steps are equal when they recorded the same call, whenever it ran.
    timings: StepTimings = field(default_factory=StepTimings, compare=False)

    @property
    def reward(self) -> float:
        """Sum of this step's reward components."""
        return float(sum(r.value for r in self.rewards))

    def shared_messages(self, previous: Step | None) -> int:
        """How many leading messages of this call's request repeat ``previous``'s request (all
        of them when the agent continued its conversation); the rest is what this call added."""
        return common_prefix_length(previous.request.messages, self.request.messages) if previous is not None else 0

    def to_dict(self, previous: Step | None = None) -> dict[str, Any]:
        """This step as plain data; given the ``previous`` step of the same episode, only what this
        call adds to it (see the module docstring; :meth:`from_dict` with the same ``previous``
        rebuilds it)."""
        data = self._full_dict()
        if previous is not None:
            taken = _take_from_previous(data, self, previous)
            if taken:
                data["from_previous"] = taken
        return data

    def _full_dict(self) -> dict[str, Any]:
        versioned = {"policy_version": self.policy_version} if self.policy_version is not None else {}
        return {
            "index": self.index,
            "request": self.request.to_dict(),
            "completion": self.completion.to_dict() if self.completion is not None else None,
            "variables": self.variables,
            "outcome": self.outcome,
            "rewards": [r.to_dict() for r in self.rewards],
            "trainable": self.trainable,
            "role": self.role,
            "agent": self.agent,
            "prompt_extends_previous": self.prompt_extends_previous,
            "prompt_rebuilt": self.prompt_rebuilt,
            "error": self.error,
            **versioned,
            "timings": self.timings.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], previous: Step | None = None) -> Step:
        """The inverse of :meth:`to_dict`: a step stored as what it adds to ``previous`` (its
        ``"from_previous"``) needs that previous step. The rebuilt request shares the previous
        step's message objects (one copy in memory, as on disk)."""
        data = dict(data)
        taken = data.pop("from_previous", None)
        if taken or "variables_changed" in data:
            if previous is None:
                raise ValueError(f"step {data.get('index')} stores only what it adds to the previous step, and none was given")
            data = _put_back_previous(data, taken or {}, previous)
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
    #: The agent's own trace spans, summarized and joined to steps (``"step"``: the index of the
    #: call each belongs to; see :mod:`agentgym_lightning.tracing.join`), at most
    #: ``GatewayLimits.max_episode_spans`` of them; empty when the agent traces nothing.
    spans: list[dict[str, Any]] = field(default_factory=list, compare=False)
    #: Spans past that bound, counted and not kept.
    spans_dropped: int = field(default=0, compare=False)
    #: The versions of the resources the episode was given (name -> version; see
    #: :mod:`agentgym_lightning.resources`): which prompt produced it. Empty when it was given none.
    resources: dict[str, str] = field(default_factory=dict)

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

    def to_dict(self, compact: bool = False) -> dict[str, Any]:
        """This episode as plain data; ``compact`` stores each step as what it adds to the previous
        one (what :class:`TrajectoryWriter` writes; :meth:`from_dict` reads both)."""
        return {
            "episode_id": self.episode_id,
            "task": self.task,
            "env_id": self.env_id,
            "steps": [s.to_dict(self.steps[i - 1] if compact and i else None) for i, s in enumerate(self.steps)],
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
            # Only when there are any: files of untraced agents stay as they were.
            **({"spans": self.spans, "spans_dropped": self.spans_dropped} if self.spans or self.spans_dropped else {}),
            **({"resources": self.resources} if self.resources else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        data = dict(data)
        # Identity fields are keys and sort keys downstream (groups, pages): a wrong type is no trajectory.
        for name, kinds in (("episode_id", (str,)), ("group_id", (str, type(None))), ("seed", (int, type(None)))):
            value = data.get(name)
            if isinstance(value, bool) or not isinstance(value, kinds):
                want = "a string" if name == "episode_id" else "a string or null" if name == "group_id" else "a whole number or null"
                raise TypeError(f"{name} must be {want}, got {type(value).__name__} {str(value)[:40]}")
        steps: list[Step] = []
        for s in data.get("steps") or []:
            steps.append(Step.from_dict(s, steps[-1] if steps else None))
        data["steps"] = steps
        data["status"] = Status(data.get("status", Status.RUNNING.value))
        data["rewards"] = [Reward.from_dict(r) for r in data.get("rewards") or []]
        if data.get("final_reward") is not None:
            _check_number("final_reward", data["final_reward"])
        return cls(**data)

    def to_json(self, compact: bool = False) -> str:
        """One line of strict JSON; never fails (see the module docstring for the mapping).
        ``compact``: each step stored as what it adds to the previous one (as files are)."""
        data = self.to_dict(compact=compact)
        try:
            return json.dumps(data, default=_json_default, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError, RecursionError):
            # NaN/Infinity, a non-string key, a cycle, a to_dict() that raises...: map the parts
            # JSON cannot hold (slower, so only when needed).
            return json.dumps(_jsonable(data, 0, set()), ensure_ascii=False, allow_nan=False)


def _take_from_previous(data: dict[str, Any], step: Step, previous: Step) -> dict[str, Any]:
    """Cut from ``data`` (``step``'s full dict) what ``previous`` already holds; returns what was
    taken, for :func:`_put_back_previous`."""
    taken: dict[str, Any] = {}
    request = data["request"] = dict(data["request"])
    shared = step.shared_messages(previous)
    if shared:
        request["messages"] = step.request.messages[shared:]
        taken["messages"] = shared
    if step.request.tools is not None and step.request.tools == previous.request.tools:
        del request["tools"]
        taken["tools"] = True
    ids = step.completion.prompt_token_ids if step.completion is not None else None
    before = previous.completion
    if ids and before is not None and before.prompt_token_ids is not None:
        # A continued conversation's prompt starts with the previous prompt and completion.
        shared = common_prefix_length(before.prompt_token_ids + (before.completion_token_ids or []), ids)
        if shared:
            data["completion"] = {**data["completion"], "prompt_token_ids": ids[shared:]}
            taken["prompt_token_ids"] = shared
    del data["variables"]
    data["variables_changed"] = {
        k: v for k, v in step.variables.items() if not _same(previous.variables.get(k, _ABSENT), v)
    }
    removed = [k for k in previous.variables if k not in step.variables]
    if removed:
        data["variables_removed"] = removed
    return taken


def _put_back_previous(data: dict[str, Any], taken: Mapping[str, Any], previous: Step) -> dict[str, Any]:
    """The full dict of a step stored by :func:`_take_from_previous`."""
    if "variables_changed" in data:
        removed = set(data.pop("variables_removed", None) or ())
        kept = {k: v for k, v in previous.variables.items() if k not in removed}
        data["variables"] = {**kept, **data.pop("variables_changed")}
    request = data["request"] = dict(data["request"])
    if taken.get("messages"):
        request["messages"] = previous.request.messages[: int(taken["messages"])] + list(request.get("messages") or [])
    if taken.get("tools"):
        request["tools"] = previous.request.tools
    if taken.get("prompt_token_ids"):
        before = previous.completion
        if before is None or before.prompt_token_ids is None or data.get("completion") is None:
            raise ValueError(f"step {data.get('index')} takes prompt token ids from a previous step that has none")
        head = (before.prompt_token_ids + (before.completion_token_ids or []))[: int(taken["prompt_token_ids"])]
        data["completion"] = {**data["completion"], "prompt_token_ids": head + list(data["completion"].get("prompt_token_ids") or [])}
    return data


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
    that was written. Each step is stored as what it adds to the previous one (module docstring).

    ``append=True`` continues a file; if a writer was killed mid-line, that half line is cut
    first (with a :class:`TruncatedLineWarning`), so the next line starts on a line boundary
    instead of being glued to it."""

    def __init__(self, path: str | os.PathLike[str], append: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if append and self.path.is_file():
            _end_on_a_line_boundary(self.path)
        self._fh: IO[str] = open(self.path, "a" if append else "w", encoding="utf-8")
        self.count = 0

    def write(self, trajectory: Trajectory) -> None:
        self._fh.write(trajectory.to_json(compact=True) + "\n")
        self._fh.flush()
        self.count += 1

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _end_on_a_line_boundary(path: Path, chunk: int = 1 << 16) -> None:
    """Make ``path`` end with a newline: a last line that is whole JSON gets its newline, a half
    line (a writer killed mid-write) is cut."""
    with open(path, "rb+") as fh:
        end = fh.seek(0, os.SEEK_END)
        if end == 0:
            return
        fh.seek(end - 1)
        if fh.read(1) == b"\n":
            return
        cut, pos = 0, end
        while pos > 0:  # the last newline, read backwards a chunk at a time
            start = max(0, pos - chunk)
            fh.seek(start)
            found = fh.read(pos - start).rfind(b"\n")
            if found >= 0:
                cut = start + found + 1
                break
            pos = start
        fh.seek(cut)
        tail = fh.read()
        try:
            json.loads(tail)
        except ValueError:  # JSONDecodeError and UnicodeDecodeError
            fh.truncate(cut)
            warnings.warn(
                f"{path}: cut a half-written last line ({end - cut} bytes, no newline) left by an interrupted "
                "writer, so the appended lines start on a line boundary",
                TruncatedLineWarning,
                stacklevel=3,
            )
        else:
            fh.write(b"\n")


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


def _check_number(what: str, value: Any) -> None:
    """A reward read from a file is a number (a string there would break every sum of returns)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number, got {type(value).__name__} {str(value)[:40]!r}")


class TruncatedLineWarning(UserWarning):
    """The last line of a trajectory file was cut off mid-write (an interrupted run)."""


class SkippedLineWarning(UserWarning):
    """A bad line of a trajectory file was skipped (``load_trajectories(..., on_error="skip")``)."""


def load_trajectories(
    path: str | os.PathLike[str], on_error: str = "raise", wanted: Callable[[bytes], bool] | None = None
) -> Iterator[Trajectory]:
    """Read trajectories back from a JSONL file written by :func:`save_trajectories`, one line at a
    time (a file of any size streams; ``list(...)`` for all of them).

    A truncated last line (a run killed mid-write) is skipped with a
    :class:`TruncatedLineWarning` naming the file and line. Any other bad line (not UTF-8, not
    JSON, not a trajectory) raises :class:`ValueError` naming the file and line, or with
    ``on_error="skip"`` is skipped with a :class:`SkippedLineWarning` saying the same.
    ``wanted``: parse only the lines (raw bytes) it accepts, e.g. those holding an episode's id.
    """
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    return _iter_lines(path, on_error, wanted)


def _iter_lines(path: str | os.PathLike[str], on_error: str, wanted: Callable[[bytes], bool] | None = None) -> Iterator[Trajectory]:
    # A trajectory file is often someone else's (a shared run folder): only a regular file of a
    # bounded size is read, and a line too long to hold is not (run_files).
    try:
        fh = open_run_file(path)
    except RunFileError as exc:
        if on_error == "raise":
            raise
        warnings.warn(f"{exc}; skipped (on_error='skip')", SkippedLineWarning, stacklevel=2)
        return
    with fh:
        for lineno, raw in iter_lines(fh):
            if raw is LONG_LINE:
                exc = ValueError(f"{path}:{lineno}: a line over {MAX_LINE_BYTES:,} bytes, not read")
                if on_error == "raise":
                    raise exc
                warnings.warn(f"{exc}; skipped (on_error='skip')", SkippedLineWarning, stacklevel=2)
                continue
            if not raw.strip() or (wanted is not None and not wanted(raw)):
                continue
            try:
                yield _parse_line(path, lineno, raw)
            except _TruncatedLine:
                warnings.warn(
                    f"{path}:{lineno}: skipped a truncated last line ({len(raw)} bytes, no newline): "
                    "the run that wrote it was interrupted mid-write",
                    TruncatedLineWarning,
                    stacklevel=2,
                )
                return
            except ValueError as exc:
                if on_error == "raise":
                    raise
                warnings.warn(f"{exc}; skipped (on_error='skip')", SkippedLineWarning, stacklevel=2)


class _TruncatedLine(Exception):
    pass


def _parse_line(path: str | os.PathLike[str], lineno: int, raw: bytes) -> Trajectory:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}:{lineno}: not UTF-8 (byte {raw[exc.start]:#04x} at column {exc.start + 1})") from exc
    try:
        data = json.loads(text)
    except RecursionError:
        raise ValueError(f"{path}:{lineno}: not a JSON trajectory (nested too deeply to read)") from None
    except json.JSONDecodeError as exc:
        if not raw.endswith(b"\n"):
            # Half-written final line of an interrupted run: the lines before it are whole.
            raise _TruncatedLine from exc
        raise ValueError(f"{path}:{lineno}: not a JSON trajectory ({exc})") from exc
    try:
        return Trajectory.from_dict(data)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, RecursionError) as exc:
        raise ValueError(f"{path}:{lineno}: not a trajectory ({type(exc).__name__}: {str(exc)[:300]})") from exc
