"""Shared fixtures: every test must leave no agent thread behind."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

# Third-party plugins installed on a developer's machine must not change test results.
os.environ.setdefault("AGENTGYM_LIGHTNING_DISABLE_PLUGIN_AUTOLOAD", "1")


def _agent_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("agent-") and t.is_alive()]


@pytest.fixture(autouse=True)
def no_leaked_agents():
    before = set(_agent_threads())
    yield
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        leaked = [t for t in _agent_threads() if t not in before]
        if not leaked:
            return
        time.sleep(0.02)
    pytest.fail(f"agent threads left running after the test: {[t.name for t in leaked]}")
