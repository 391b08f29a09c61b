"""The math AIR plugin reads the agent's outcome variables."""

from __future__ import annotations

from agentgym_lightning.llm import ChatRequest
from agentgym_lightning.plugin_manager import env_plugins, get_plugin_manager
from agentgym_lightning.envs.math import plugin as math_air
from agentgym_lightning.trajectory import Step, Trajectory

WEIGHTS = dict.fromkeys(math_air.SOURCES, 1.0)


def _signals(outcome, weights=WEIGHTS):
    step = Step(index=0, request=ChatRequest(messages=[{"role": "user", "content": "q"}]), outcome=outcome)
    return {r.source: r.value for r in math_air.agentgym_intermediate_rewards(step, Trajectory(episode_id="e"), weights)}


def test_signals():
    calls = [{"expression": "1+1", "result": "2"}, {"expression": "x", "error": "forbidden", "message": "..."}]
    assert _signals({"calculator": calls}) == {"math.calc_ok": 1.0, "math.calc_error": 1.0}
    assert _signals({"answer_status": "missing", "calculator_calls": 2}) == {"math.answer_missing": 1.0}
    assert _signals({"answer_status": "unparsable", "calculator_calls": 0}) == {"math.answer_unparsable": 1.0}
    assert _signals({"answer_status": "ok", "calculator_calls": 0}) == {"math.no_tool": 1.0}
    assert _signals({"answer_status": "ok", "calculator_calls": 1}) == {}
    assert _signals({"sql_status": "executes"}) == {}  # another env's step
    assert _signals({"calculator": calls}, {"math.calc_error": -1.0}) == {"math.calc_error": 1.0}
    assert _signals({"calculator": calls}, {"other": 1.0}) == {}


def test_registered():
    # Found beside its env, not listed by the core; it also registers the math env ids.
    assert "agentgym_lightning.envs.math.plugin" in env_plugins()
    assert get_plugin_manager().get_plugin("envs.math.plugin") is math_air
    assert [s["id"] for s in math_air.agentgym_register_envs()] == [
        "lightning/GSM8K-v0",
        "lightning/CalcX-v0",
        "lightning/Arithmetic-v0",
    ]
