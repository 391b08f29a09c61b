"""Helpers for the framework adapter tests: load an agent file as it is, unedited."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

AGENTS = Path(__file__).parent / "agents"


@pytest.fixture
def agent_file():
    """``agent_file("langgraph_calculator")``: that file under ``agents/`` as a module (its
    framework must be installed: the test skips, saying which extra, when it is not)."""

    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(f"framework_agent_{name}", AGENTS / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
