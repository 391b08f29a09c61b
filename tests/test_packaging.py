"""The built wheel ships plugins/ and envs/ inside the package, and works on its own."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHECK = """
import importlib.util, sys
import agentgym_lightning, agentgym_lightning.plugins.credit, agentgym_lightning.envs.guess_number
import agentgym_lightning.testing.conformance, agentgym_lightning.testing.pytest_plugin
import gymnasium as gym
site = sys.argv[1]
for mod in (agentgym_lightning, agentgym_lightning.plugins.credit, agentgym_lightning.envs.guess_number):
    assert mod.__file__.startswith(site), (mod.__name__, mod.__file__)
assert importlib.util.find_spec("plugins") is None and importlib.util.find_spec("envs") is None
env = gym.make("lightning/GuessNumber-v0")
obs, _ = env.reset(seed=0)
env.close()
print("wheel ok")
"""


def test_wheel_maps_plugins_and_envs_under_the_package(tmp_path):
    out = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(REPO)],
        check=True,
        timeout=300,
    )
    (wheel,) = out.glob("agentgym_lightning-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "agentgym_lightning/plugins/credit.py" in names
    assert "agentgym_lightning/envs/guess_number.py" in names
    # Every subpackage of the source tree ships (each must be in pyproject's `packages` list).
    subpackages = sorted(p.parent.relative_to(REPO).as_posix() for p in (REPO / "agentgym_lightning").rglob("__init__.py"))
    assert "agentgym_lightning/testing" in subpackages
    assert [s for s in subpackages if f"{s}/__init__.py" not in names] == []
    assert not [n for n in names if n.split("/")[0] in ("plugins", "envs", "tests", "bench")]
    top_level = next(n for n in names if n.endswith("top_level.txt"))
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["agentgym_lightning"]
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "agentgym-lightning = agentgym_lightning.cli:main" in entry_points

    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)], check=True, timeout=300
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    # Run outside the checkout so the repo's own folders cannot be imported by accident.
    proc = subprocess.run(
        [sys.executable, "-c", CHECK, str(site)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert "wheel ok" in proc.stdout
