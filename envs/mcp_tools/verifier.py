"""A user's verifier, named on the command line: ``module:function`` (importable from the current
folder) or ``path/to/file.py:function``. It is called as ``function(task, answer)`` with the task
(its JSONL object) and the agent's final answer (``None`` when it gave none), and returns the
episode's reward (a number)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from agentgym_lightning.registration import file_factory, is_file_factory

__all__ = ["Verifier", "load_verifier"]

_KIND = "a function (task, answer) -> reward"

#: ``verifier(task, answer) -> reward``.
Verifier = Callable[[dict[str, Any], "str | None"], float]


def load_verifier(spec: str) -> Verifier:
    """The function ``spec`` names. Raises ``ValueError`` saying what is missing."""
    if is_file_factory(spec):
        return file_factory(spec, "verifier=", _KIND)
    module_name, sep, name = spec.rpartition(":")
    if not sep or not module_name or not name.isidentifier():
        raise ValueError(f"verifier={spec}: give module:function or path/to/file.py:function ({_KIND})")
    if os.getcwd() not in sys.path:  # as `python -m` does: a module beside you imports
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"verifier={spec}: cannot import {module_name!r} ({exc})") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise ValueError(f"verifier={spec}: {module_name} has no function {name!r} ({_KIND})")
    return function
