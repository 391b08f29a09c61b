"""pytest plugin of the conformance kit: the ``agent_conformance`` fixture.

Enable it in your top-level ``conftest.py``::

    pytest_plugins = ["agentgym_lightning.testing.pytest_plugin"]

then::

    def test_my_agent_conforms(agent_conformance):
        agent_conformance(MyFrameworkAgent(my_fn), task="What is 2+3?").assert_ok()

See :mod:`agentgym_lightning.testing.conformance` for what is checked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agentgym_lightning.testing.conformance import ConformanceReport, check_agent

__all__ = ["agent_conformance"]


@pytest.fixture
def agent_conformance() -> Callable[..., ConformanceReport]:
    """:func:`~agentgym_lightning.testing.conformance.check_agent`: ``agent_conformance(agent, task, **options)``
    runs one scripted episode and returns the report (call ``.assert_ok()`` on it)."""

    def run(agent: Any, task: Any = "What is 1 + 1?", **options: Any) -> ConformanceReport:
        return check_agent(agent, task, **options)

    return run
