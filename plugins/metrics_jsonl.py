"""Run logging to ``<output_dir>/metrics.jsonl``: every training metric, one strict-JSON line per
log call, so nothing depends on W&B being installed or reachable.

Each line is ``{"step": N, "time": unix_seconds, "<metric>": value, ...}``; undefined values
(NaN, infinities) are written as ``null``. A resumed run appends to the same file, after cutting
it back to the step it resumes from: what the run logged after its checkpoint (a step it then
takes again, a line half-written when it was killed) goes, so every step has one record per
log call, as the viewer, the report and W&B (which keeps the first value it got for a step) see.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from agentgym_lightning.hookspecs import hookimpl
from agentgym_lightning.metrics import json_metrics

FILENAME = "metrics.jsonl"


class _Log:
    fh: IO[str] | None = None
    path: Path | None = None


_log = _Log()


@hookimpl
def agentgym_train_start(config: Mapping[str, Any], output_dir: str, step: int) -> Sequence[str] | None:
    path = Path(output_dir) / FILENAME
    path.parent.mkdir(parents=True, exist_ok=True)
    if _log.fh is not None:
        _log.fh.close()
    if step > 0:
        _cut_to_step(path, step)
    _log.fh = open(path, "a" if step > 0 else "w", encoding="utf-8")
    _log.path = path
    return None


def _cut_to_step(path: Path, step: int) -> None:
    """Keep the records of ``path`` up to ``step`` (and nothing unreadable), replacing it atomically."""
    if not path.is_file():
        return
    kept = []
    with open(path, "rb") as fh:
        for raw in fh:
            try:
                record = json.loads(raw)
            except (ValueError, RecursionError):
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] <= step:
                kept.append(raw if raw.endswith(b"\n") else raw + b"\n")
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(b"".join(kept))
    os.replace(tmp, path)


@hookimpl
def agentgym_log_metrics(metrics: Mapping[str, float], step: int | None) -> None:
    if _log.fh is None:
        return
    record = {"step": step, "time": time.time(), **json_metrics(metrics)}
    _log.fh.write(json.dumps(record, allow_nan=False) + "\n")
    _log.fh.flush()


@hookimpl
def agentgym_train_end(output_dir: str, metrics: Mapping[str, float], interrupted: bool) -> Sequence[str] | None:
    if _log.fh is None:
        return None
    _log.fh.close()
    _log.fh = None
    return [f"metrics: {_log.path}"]
