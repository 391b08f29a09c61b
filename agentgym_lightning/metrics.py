"""Metric values in JSON: a NaN or infinite metric (a loss of a skipped update, a mean over no
episodes) is written as ``null``, never as the invalid JSON tokens ``NaN`` / ``Infinity``.

One rule for every writer of metrics: ``metrics.jsonl``, checkpoints' ``trainer_state.json``, the
``--json`` summaries of ``train`` and ``eval``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["finite_or_none", "json_metrics"]


def finite_or_none(value: Any) -> Any:
    """``value``, or ``None`` when it is a non-finite float."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def json_metrics(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``metrics`` with every non-finite float replaced by ``None``."""
    return {key: finite_or_none(value) for key, value in metrics.items()}
