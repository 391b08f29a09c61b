"""The math plugin: registers ``lightning/GSM8K-v0``, ``CalcX-v0`` and ``Arithmetic-v0`` and gives
their AIR, calculator and answer signals.

The math agent (``agentgym_lightning.envs.math.agent``) emits, after each call, what followed
it; this plugin reads that from the step's ``outcome`` and gives these signals (raw values; the
env multiplies each by its ``air_weights`` entry and drops those without one):

============================  ====================================================================
source                        raw value, on which step
============================  ====================================================================
``math.calc_ok``              calculator calls of this step that returned a result
``math.calc_error``           calculator calls of this step that failed: a bad or refused
                              expression, a ``<tool_call>`` that could not be read, another tool,
                              missing arguments
``math.answer_missing``       1.0 on the last step when the episode ended without an answer (no
                              number in the final reply, or the turns ran out)
``math.answer_unparsable``    1.0 on the last step when the final reply had an answer marker but
                              nothing readable after it
``math.no_tool``              1.0 on the last step when an answer came without any calculator call
                              in the episode (the envs report it with weight 0 by default)
============================  ====================================================================

With ``agent="solver-verifier"`` (:mod:`.verifier`) these come from the solver's calls (its
variables land there); the verifier's call has none of them, and no source of its own: its
answer is the final one, so the final reward already is its outcome, and a signal for "accepted
a wrong answer" or "fixed a wrong one" would only repeat it.

::

    gym.make("lightning/Arithmetic-v0", air_weights={"math.calc_ok": 0.1, "math.calc_error": -0.1})
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentgym_lightning.hookspecs import hookimpl
from agentgym_lightning.trajectory import Reward, Step, Trajectory

SOURCES: tuple[str, ...] = (
    "math.calc_ok",
    "math.calc_error",
    "math.answer_missing",
    "math.answer_unparsable",
    "math.no_tool",
)



@hookimpl
def agentgym_register_envs() -> list[dict[str, Any]]:
    return [
        {"id": "lightning/GSM8K-v0", "entry_point": "agentgym_lightning.envs.math.env:make_gsm8k_env"},
        {"id": "lightning/CalcX-v0", "entry_point": "agentgym_lightning.envs.math.env:make_calcx_env"},
        {"id": "lightning/Arithmetic-v0", "entry_point": "agentgym_lightning.envs.math.env:make_arithmetic_env"},
    ]


@hookimpl
def agentgym_intermediate_rewards(step: Step, trajectory: Trajectory, weights: Mapping[str, float]) -> list[Reward]:
    if not any(source in weights for source in SOURCES):
        return []
    outcome = step.outcome
    signals: dict[str, float] = {}
    records = outcome.get("calculator")
    if isinstance(records, list) and records:
        failed = sum(1 for r in records if isinstance(r, Mapping) and "error" in r)
        signals["math.calc_ok"] = float(len(records) - failed)
        signals["math.calc_error"] = float(failed)
    status = outcome.get("answer_status")
    if isinstance(status, str):
        if status == "missing":
            signals["math.answer_missing"] = 1.0
        elif status == "unparsable":
            signals["math.answer_unparsable"] = 1.0
        elif status == "ok" and outcome.get("calculator_calls") == 0:
            signals["math.no_tool"] = 1.0
    return [Reward(value=value, source=source) for source, value in signals.items() if source in weights and value]
