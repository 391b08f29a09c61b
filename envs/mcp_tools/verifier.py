"""A user's verifier, named on the command line: ``module:function`` (importable from the current
folder) or ``path/to/file.py:function``. It is called as ``function(task, answer)`` with the task
(its JSONL object) and the agent's final answer (``None`` when it gave none), and returns the
episode's reward (a number)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentgym_lightning.envs.callables import load_callable

__all__ = ["Verifier", "load_verifier"]

#: ``verifier(task, answer) -> reward``.
Verifier = Callable[[dict[str, Any], "str | None"], float]


def load_verifier(spec: str) -> Verifier:
    """The function ``spec`` names. Raises ``ValueError`` saying what is missing."""
    return load_callable(spec, "verifier=", "a function (task, answer) -> reward")
