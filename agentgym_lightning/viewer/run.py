"""A training run's folder, read as it is written: its metrics, its config, its episode files.

What ``agentgym-lightning train`` leaves in ``--output-dir``::

    metrics.jsonl                      one line per log call: {"step", "time", "<metric>": value}
    trajectories/step-000001.jsonl     the episodes of training step 1 (written as they finish)
    eval/step-000000.jsonl             the held-out episodes evaluated after step 0 (before training)
    checkpoints/checkpoint-N/trainer_state.json   the config (among other things)

Everything here reads files at the moment it is asked, so a live run shows what it has written
so far; an episode file is parsed again only when it changed (size or mtime), and parsed files
are kept up to :attr:`RunFolder.cache_bytes` (a bigger file is read line by line each time; one
episode's page reads only its group: :meth:`RunFolder.episode_group`).

Everything in a run folder is data written by agents and envs, and the folder may be anyone's:
only regular files of bounded size are read, line by line within a bounded length
(:mod:`agentgym_lightning.run_files`: a FIFO or a link to ``/dev/zero`` is a problem listed, not a
hang). A line that cannot be read (not
JSON, nested too deeply, a step that is not a small non-negative integer, a reward that is not a
number) is skipped and listed by :meth:`RunFolder.problems`, which the pages show; a half-written
last line of a live file is simply not read yet.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym_lightning.run_files import LONG_LINE, MAX_LINE_BYTES, RunFileError, iter_lines, open_run_file, read_run_text
from agentgym_lightning.trajectory import SkippedLineWarning, Trajectory, load_trajectories

__all__ = ["EpisodeFile", "RunFolder"]

_STEP_FILE = re.compile(r"^step-(\d+)\.jsonl$")
#: Steps a run can have (larger numbers in a file are not steps: 10^400 would overflow a chart).
MAX_STEP = 10**12
#: The largest metrics.jsonl read (a million steps' metrics are far less; its records are held).
MAX_METRICS_BYTES = 256 * 2**20
#: Problems listed per file (a file of bad lines is not listed line by line).
MAX_PROBLEMS = 20
#: The episode file kinds: training steps and held-out evaluations.
KINDS = {"train": "trajectories", "eval": "eval"}


@dataclass(frozen=True)
class EpisodeFile:
    """One file of episodes: ``kind`` is ``"train"`` (the episodes of training step ``step``) or
    ``"eval"`` (the held-out evaluation after ``step`` updates)."""

    kind: str
    step: int
    path: Path


class RunFolder:
    """The output folder of one training run (see the module docstring)."""

    #: Episode files kept parsed in memory (a long run's files are not all held at once) ...
    cached_files = 16
    #: ... and their total size on disk at most (the parsed episodes take about as much memory).
    cache_bytes = 256 * 2**20

    def __init__(self, path: str | Path, name: str | None = None) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise FileNotFoundError(f"{self.path}: no such run folder (give the --output-dir of a train run)")
        self.name = name or self.path.name
        self._cache: dict[Path, tuple[tuple[int, int], list[Trajectory]]] = {}
        self._problems: dict[Path, list[str]] = {}
        self._decoder: tuple[Callable[[list[int]], list[str]] | None] | None = None

    def metrics(self) -> list[dict[str, Any]]:
        """Every record of ``metrics.jsonl``, in order (a half-written last line is left out)."""
        path = self.path / "metrics.jsonl"
        if not path.is_file():
            return []
        records: list[dict[str, Any]] = []
        problems: list[str] = []
        try:
            fh = open_run_file(path, MAX_METRICS_BYTES)
        except (RunFileError, OSError) as exc:
            self._problems[path] = [f"{path.name}: not read ({exc.strerror if isinstance(exc, OSError) and exc.strerror else exc})"]
            return records
        with fh:
            for lineno, raw in iter_lines(fh):
                if len(problems) >= MAX_PROBLEMS:
                    problems = problems[:MAX_PROBLEMS]
                if raw is LONG_LINE:
                    problems.append(f"{path.name}:{lineno}: a line over {MAX_LINE_BYTES:,} bytes, not read")
                    continue
                try:
                    record = json.loads(raw)
                except (ValueError, RecursionError) as exc:
                    if raw.endswith(b"\n"):  # else a line being written
                        problems.append(f"{path.name}:{lineno}: not JSON ({'nested too deeply' if isinstance(exc, RecursionError) else exc})")
                    continue
                step = record.get("step") if isinstance(record, dict) else None
                if isinstance(step, int) and not isinstance(step, bool) and 0 <= step <= MAX_STEP:
                    records.append(record)
                else:
                    problems.append(f"{path.name}:{lineno}: no step (a whole number from 0 to {MAX_STEP}): {str(step)[:40]}")
        self._problems[path] = problems
        return records

    def series(self) -> dict[str, list[tuple[int, float]]]:
        """Each metric's ``(step, value)`` points (``null`` values left out); a resumed run that
        logged a step again keeps the last value."""
        points: dict[str, dict[int, float]] = defaultdict(dict)
        for record in self.metrics():
            for name, value in record.items():
                if name not in ("step", "time") and isinstance(value, (int, float)) and not isinstance(value, bool):
                    number = float(value) if isinstance(value, float) or abs(value) < 2**1000 else math.inf
                    if math.isfinite(number):  # a chart has no place for 10^400
                        points[str(name)][record["step"]] = number
        return {name: sorted(by_step.items()) for name, by_step in points.items()}

    def config(self) -> dict[str, Any]:
        """The run's config, from its newest checkpoint (``{}`` before the first one)."""
        states = sorted(
            (int(m.group(1)), p)
            for p in (self.path / "checkpoints").glob("checkpoint-*/trainer_state.json")
            if (m := re.search(r"checkpoint-(\d+)", str(p.parent.name)))
        )
        for _, path in reversed(states):
            try:
                return dict(json.loads(read_run_text(path)).get("config") or {})
            except (OSError, ValueError, AttributeError, TypeError, RecursionError):
                continue
        return {}

    def episode_files(self) -> list[EpisodeFile]:
        """Every episode file, training steps then evaluations, each by step."""
        found = []
        for kind, folder in KINDS.items():
            for path in (self.path / folder).glob("step-*.jsonl"):
                if m := _STEP_FILE.match(path.name):
                    found.append(EpisodeFile(kind, int(m.group(1)), path))
        return sorted(found, key=lambda f: (f.kind != "train", f.step))

    def episode_file(self, kind: str, step: int) -> EpisodeFile:
        if kind not in KINDS:
            raise KeyError(f"no episode kind {kind!r} (train or eval)")
        path = self.path / KINDS[kind] / f"step-{step:06d}.jsonl"
        if not path.is_file():
            raise KeyError(f"{path}: no such episode file")
        return EpisodeFile(kind, step, path)

    def problems(self, file: EpisodeFile | None = None) -> list[str]:
        """The lines skipped when ``file`` (default: ``metrics.jsonl``) was last read, and why."""
        return list(self._problems.get(file.path if file is not None else self.path / "metrics.jsonl", []))

    def _read(self, path: Path, wanted: Callable[[bytes], bool] | None = None) -> list[Trajectory]:
        """The episodes of ``path``, line by line; ``wanted``: parse only the lines it accepts."""
        problems: list[str] = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            # A live run's last line is often half written: that one is not a problem (TruncatedLineWarning).
            episodes = list(load_trajectories(path, on_error="skip", wanted=wanted))
        for w in caught:
            if issubclass(w.category, SkippedLineWarning) and len(problems) < MAX_PROBLEMS:
                problems.append(str(w.message).removeprefix(str(path.parent) + "/").removesuffix("; skipped (on_error='skip')"))
        if wanted is None:
            self._problems[path] = problems
        return episodes

    def episodes(self, file: EpisodeFile) -> list[Trajectory]:
        """The episodes of ``file`` (bad lines skipped and listed in :meth:`problems`)."""
        stat = file.path.stat()
        key = (stat.st_size, stat.st_mtime_ns)
        cached = self._cache.get(file.path)
        if cached is not None and cached[0] == key:
            return cached[1]
        episodes = self._read(file.path)
        self._cache.pop(file.path, None)
        if stat.st_size <= self.cache_bytes:
            self._cache[file.path] = (key, episodes)
        sizes = {path: k[0] for path, (k, _) in self._cache.items()}
        while self._cache and (len(self._cache) > self.cached_files or sum(sizes.values()) > self.cache_bytes):
            oldest = next(iter(self._cache))  # the least recently parsed go first
            del self._cache[oldest]
            sizes.pop(oldest)
        return episodes

    def episode_group(self, file: EpisodeFile, episode_id: str) -> list[Trajectory]:
        """The episode ``episode_id`` of ``file`` and the others of its GRPO group (what its
        credit and advantage need), without parsing the file's other episodes when it is not
        held already; ``[]`` when there is no such episode."""
        cached = self._cache.get(file.path)
        if cached is not None:
            stat = file.path.stat()
            if cached[0] == (stat.st_size, stat.st_mtime_ns):
                return _group_of(cached[1], episode_id)
        # Lines that cannot hold the id are not parsed (the id appears in its line as JSON writes it).
        needle = json.dumps(episode_id, ensure_ascii=False).encode("utf-8")
        found = [t for t in self._read(file.path, lambda raw: needle in raw) if t.episode_id == episode_id]
        if not found or found[0].group_id is None:
            return found[:1]
        group = json.dumps(found[0].group_id, ensure_ascii=False).encode("utf-8")
        return _group_of(self._read(file.path, lambda raw: group in raw), episode_id)

    def token_decoder(self) -> Callable[[list[int]], list[str]] | None:
        """Token ids to their text, with the tokenizer the run saved in ``final/`` (once the run
        ended, and when transformers is installed); ``None`` otherwise (the views show ids)."""
        if self._decoder is None:
            self._decoder = (None,)
            if (self.path / "final" / "tokenizer_config.json").is_file():
                try:
                    from transformers import AutoTokenizer

                    tokenizer = AutoTokenizer.from_pretrained(self.path / "final")
                except (ImportError, OSError, ValueError):
                    return None
                self._decoder = (lambda ids: [tokenizer.decode([i]) for i in ids],)
        return self._decoder[0]

    def version(self, file: EpisodeFile | None = None) -> int:
        """Changes whenever the run writes something the views show (for live refresh); with
        ``file``, only when that file changes."""
        newest = 0
        paths = [file.path] if file is not None else [self.path / "metrics.jsonl", *(f.path for f in self.episode_files())]
        for path in paths:
            try:
                newest = max(newest, path.stat().st_mtime_ns)
            except OSError:
                continue
        return newest


def _group_of(episodes: list[Trajectory], episode_id: str) -> list[Trajectory]:
    found = next((t for t in episodes if t.episode_id == episode_id), None)
    if found is None:
        return []
    if found.group_id is None:
        return [found]
    return [t for t in episodes if t.group_id == found.group_id]
