"""A training run's folder, read as it is written: its metrics, its config, its episode files.

What ``agentgym-lightning train`` leaves in ``--output-dir``::

    metrics.jsonl                      one line per log call: {"step", "time", "<metric>": value}
    trajectories/step-000001.jsonl     the episodes of training step 1 (written as they finish)
    eval/step-000000.jsonl             the held-out episodes evaluated after step 0 (before training)
    checkpoints/checkpoint-N/trainer_state.json   the config (among other things)

Everything here reads files at the moment it is asked, so a live run shows what it has written
so far; an episode file is parsed again only when it changed (size or mtime).
"""

from __future__ import annotations

import json
import re
import warnings
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym_lightning.trajectory import Trajectory, load_trajectories

__all__ = ["EpisodeFile", "RunFolder"]

_STEP_FILE = re.compile(r"^step-(\d+)\.jsonl$")
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

    #: Episode files kept parsed in memory (a long run's files are not all held at once).
    cached_files = 16

    def __init__(self, path: str | Path, name: str | None = None) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise FileNotFoundError(f"{self.path}: no such run folder (give the --output-dir of a train run)")
        self.name = name or self.path.name
        self._cache: dict[Path, tuple[tuple[int, int], list[Trajectory]]] = {}
        self._decoder: tuple[Callable[[list[int]], list[str]] | None] | None = None

    def metrics(self) -> list[dict[str, Any]]:
        """Every record of ``metrics.jsonl``, in order (a half-written last line is left out)."""
        path = self.path / "metrics.jsonl"
        if not path.is_file():
            return []
        records = []
        with open(path, "rb") as fh:
            for raw in fh:
                try:
                    record = json.loads(raw)
                except ValueError:
                    continue  # a line being written, or a bad one: a chart is no place to fail
                if isinstance(record, dict) and isinstance(record.get("step"), int):
                    records.append(record)
        return records

    def series(self) -> dict[str, list[tuple[int, float]]]:
        """Each metric's ``(step, value)`` points (``null`` values left out); a resumed run that
        logged a step again keeps the last value."""
        points: dict[str, dict[int, float]] = defaultdict(dict)
        for record in self.metrics():
            for name, value in record.items():
                if name not in ("step", "time") and isinstance(value, (int, float)) and not isinstance(value, bool):
                    points[name][record["step"]] = float(value)
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
                return dict(json.loads(path.read_text(encoding="utf-8")).get("config") or {})
            except (OSError, ValueError):
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

    def episodes(self, file: EpisodeFile) -> list[Trajectory]:
        """The episodes of ``file`` (bad lines skipped: a live file may end mid-line)."""
        stat = file.path.stat()
        key = (stat.st_size, stat.st_mtime_ns)
        cached = self._cache.get(file.path)
        if cached is not None and cached[0] == key:
            return cached[1]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a live run's last line is often half written
            episodes = list(load_trajectories(file.path, on_error="skip"))
        self._cache.pop(file.path, None)
        self._cache[file.path] = (key, episodes)
        while len(self._cache) > self.cached_files:  # the least recently parsed go first
            del self._cache[next(iter(self._cache))]
        return episodes

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
