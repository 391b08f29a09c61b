"""The ``agentgym-lightning`` command's process-wide settings."""

from __future__ import annotations

import os
import subprocess
import sys


def _probe(code: str, **env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    return subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, check=True).stdout.split()


def test_the_command_makes_idle_openmp_threads_sleep_unless_told_otherwise():
    """OMP_WAIT_POLICY=PASSIVE is set before torch loads OpenMP (by the package's import, which the
    command's module runs first); a policy the user set is kept, and once torch is loaded nothing
    is changed (OpenMP has read it already)."""
    probe = "import os; from agentgym_lightning.cli import main; print(os.environ.get('OMP_WAIT_POLICY'))"
    assert _probe(probe) == ["PASSIVE"]
    assert _probe(probe, OMP_WAIT_POLICY="ACTIVE") == ["ACTIVE"]
    assert _probe("import torch; " + probe) == ["None"]
