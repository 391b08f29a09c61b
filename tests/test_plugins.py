"""Plugins: bundled credit strategies (property tests), discovery from an installed entry point."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import given

from agentgym_lightning import ChatRequest, Reward, Status, Step, Trajectory
from agentgym_lightning.credit import assign_credit, credit_strategies
from agentgym_lightning.plugin_manager import BUNDLED_PLUGINS, get_plugin_manager, reset_plugin_manager

REPO = Path(__file__).resolve().parents[1]

FLOATS = st.floats(-10, 10, allow_nan=False)


@st.composite
def trajectories(draw):
    n = draw(st.integers(1, 12))
    steps = [
        Step(index=i, request=ChatRequest(messages=[{"role": "user", "content": "x"}]), rewards=[Reward(v, "air") for v in draw(st.lists(FLOATS, max_size=2))])
        for i in range(n)
    ]
    pre = [Reward(v, "pre") for v in draw(st.lists(FLOATS, max_size=1))]
    return Trajectory(episode_id="e", steps=steps, final_reward=draw(st.one_of(st.none(), FLOATS)), rewards=pre, status=Status.SUCCEEDED)


def test_bundled_strategies_are_registered():
    assert {"identical", "discounted", "final-only"} <= set(credit_strategies())
    with pytest.raises(ValueError, match="available: discounted, final-only, identical"):
        assign_credit(Trajectory(episode_id="e"), "nope")


@given(trajectories())
def test_identical_gives_every_call_the_episode_return(t):
    values = assign_credit(t, "identical")
    assert len(values) == len(t.steps)
    assert all(v == pytest.approx(t.total_reward) for v in values)


@given(trajectories())
def test_final_only_preserves_the_total_and_rewards_nothing_twice(t):
    values = assign_credit(t, "final-only")
    assert sum(values) == pytest.approx(t.total_reward, abs=1e-9)
    assert values[:-1] == pytest.approx([s.reward for s in t.steps[:-1]])


@given(trajectories(), st.floats(0, 1))
def test_discounted_is_a_return_to_go(t, gamma):
    values = assign_credit(t, "discounted", gamma=gamma)
    own = assign_credit(t, "final-only")
    for i in range(len(values) - 1):  # Bellman: R_t = r_t + gamma R_{t+1}
        assert values[i] == pytest.approx(own[i] + gamma * values[i + 1], abs=1e-6)
    assert values[-1] == pytest.approx(own[-1])


@given(trajectories())
def test_discounted_edge_gammas(t):
    assert assign_credit(t, "discounted", gamma=1.0)[0] == pytest.approx(t.total_reward, abs=1e-6)
    assert assign_credit(t, "discounted", gamma=0.0) == pytest.approx(assign_credit(t, "final-only"))
    with pytest.raises(ValueError, match="gamma"):
        assign_credit(t, "discounted", gamma=1.5)


def _make_plugin_package(root: Path) -> None:
    """A tiny installed distribution exposing a plugin through the entry-point group."""
    (root / "agl_testplugin.py").write_text(
        textwrap.dedent(
            """
            from agentgym_lightning import hookimpl

            @hookimpl
            def agentgym_credit_strategies():
                return {"halved": lambda trajectory: [trajectory.total_reward / 2] * len(trajectory.steps)}
            """
        )
    )
    dist = root / "agl_testplugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: agl-testplugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[agentgym_lightning]\nhalved = agl_testplugin\n")


def test_a_plugin_is_discovered_from_an_installed_entry_point(tmp_path, monkeypatch):
    _make_plugin_package(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("AGENTGYM_LIGHTNING_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    reset_plugin_manager()
    try:
        pm = get_plugin_manager()
        assert "halved" in credit_strategies()
        t = Trajectory(episode_id="e", steps=[Step(index=0, request=ChatRequest(messages=[]))], final_reward=3.0)
        assert assign_credit(t, "halved") == [1.5]
        names = {name for name, _ in pm.list_name_plugin()}
        assert set(BUNDLED_PLUGINS) <= names and "halved" in names
    finally:
        reset_plugin_manager()

    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop("AGENTGYM_LIGHTNING_DISABLE_PLUGIN_AUTOLOAD", None)
    out = subprocess.run(
        [sys.executable, "-m", "agentgym_lightning", "plugins"], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "halved" in out.stdout and "agl-testplugin 0.1" in out.stdout
    assert "credit" in out.stdout and "agentgym_credit_strategies" in out.stdout
