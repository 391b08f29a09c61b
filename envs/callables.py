"""A function or class a user names in an env kwarg, shared by the env packages:
``module:name`` (importable from the current folder) or ``path/to/file.py:name``."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from agentgym_lightning.registration import file_factory, is_file_factory

__all__ = ["load_callable"]


def load_callable(spec: str, option: str, kind: str) -> Callable[..., Any]:
    """The callable ``spec`` names. Raises ``ValueError`` saying what is missing, as ``option``
    (``"verifier="``) named it and what ``kind`` of callable it must be."""
    if is_file_factory(spec):
        return file_factory(spec, option, kind)
    module_name, sep, name = spec.rpartition(":")
    if not sep or not module_name or not name.isidentifier():
        raise ValueError(f"{option}{spec}: give module:name or path/to/file.py:name ({kind})")
    if os.getcwd() not in sys.path:  # as `python -m` does: a module beside you imports
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{option}{spec}: cannot import {module_name!r} ({exc})") from None
    found = getattr(module, name, None)
    if not callable(found):
        raise ValueError(f"{option}{spec}: {module_name} has no {name!r} ({kind})")
    return found
