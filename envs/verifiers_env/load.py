"""Loading a verifiers environment as its Hub does: import the module, call its
``load_environment(**kwargs)``, get a ``vf.Environment`` of the classic API.

The environment is loaded once per process for the same module and kwargs: a rollout driver
builds one env per concurrent episode, and they share the Environment, as verifiers' own
``generate`` runs its rollouts concurrently on one (loading a data set again per episode would
cost minutes on a large one).

A module named with dashes (an Environments Hub id, ``vf-math-python``) is imported with
underscores, as ``vf.load_environment`` does; one beside you imports (the current folder is on
the path, as with ``python -m``).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import threading
from collections.abc import Mapping
from typing import Any

from .errors import VerifiersLoadError

__all__ = ["load_environment"]

_loaded: dict[tuple[str, str], Any] = {}
_lock = threading.Lock()


def load_environment(module: str, kwargs: Mapping[str, Any]) -> Any:
    """The Environment ``module.load_environment(**kwargs)`` returns (loaded once per process for
    the same ``module`` and ``kwargs``). Raises
    :class:`VerifiersLoadError` when the module does not import, has no
    ``load_environment``, refuses the kwargs, or returns something without the classic API's
    ``run_rollout`` and ``rubric``."""
    key = (module, json.dumps(dict(kwargs), sort_keys=True, default=repr))
    with _lock:
        if key not in _loaded:
            _loaded[key] = _load(module, kwargs)
        return _loaded[key]


def _load(module: str, kwargs: Mapping[str, Any]) -> Any:
    if importlib.util.find_spec("verifiers") is None:
        raise VerifiersLoadError(
            f"verifiers:{module}: verifiers is not installed; `make setup-verifiers` builds .venv-verifiers with it "
            "(no verifiers release installs beside the autogen, mcp and openai-agents extras: docs/environments.md)"
        )
    name = module.replace("-", "_")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        imported = importlib.import_module(name)
    except ImportError as exc:
        raise VerifiersLoadError(
            f"verifiers:{module}: cannot import {name!r} ({exc}); install the environment (`pip install {module}`, "
            "or `vf-install` for a Hub one) or run from the folder that holds it"
        ) from None
    loader = getattr(imported, "load_environment", None)
    if not callable(loader):
        raise VerifiersLoadError(
            f"verifiers:{module}: {name} has no load_environment; a verifiers environment module defines "
            "load_environment(**kwargs) returning a vf.Environment (vf.SingleTurnEnv, vf.ToolEnv, ...)"
        )
    try:
        environment = loader(**kwargs)
    except TypeError as exc:
        raise VerifiersLoadError(f"verifiers:{module}: load_environment({_kwargs(kwargs)}) refused its arguments: {exc}") from exc
    if not callable(getattr(environment, "run_rollout", None)) or getattr(environment, "rubric", None) is None:
        raise VerifiersLoadError(
            f"verifiers:{module}: load_environment returned a {type(environment).__name__}, not a verifiers "
            "Environment of the classic API (vf.SingleTurnEnv, vf.MultiTurnEnv, vf.ToolEnv): one with run_rollout and a rubric"
        )
    return environment


def _kwargs(kwargs: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
