"""Reading a JSONL file line by line, shared by the env packages that read one: each record with
its line number, so an error names the line to fix."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["jsonl_records"]


def jsonl_records(path: Path, error: type[ValueError] = ValueError) -> Iterator[tuple[int, Any]]:
    """``(line number, parsed record)`` for each non-blank line of ``path``. A line that is not
    JSON raises ``error("<path>:<line> is not valid JSON: <why>")``."""
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as exc:
                raise error(f"{path}:{number} is not valid JSON: {exc.msg}") from None
