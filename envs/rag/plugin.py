"""The RAG plugin: registers ``lightning/MuSiQue-v0`` and ``lightning/HotpotQA-v0`` and gives their
AIR, what a search or answer did.

After each LLM call the RAG agent emits what followed it into that step's ``outcome`` (see
``agentgym_lightning.envs.rag.agent``). This plugin turns that into signals, each of raw value
below; the env keeps only the sources ``air_weights`` names and multiplies them by their weight,
so AIR is off unless asked for::

    gym.make("lightning/MuSiQue-v0", air_weights={"rag.supporting": 0.1, "rag.answer_missing": -0.5})

| source | raw value | when |
|---|---|---|
| ``rag.supporting`` | supporting passages first retrieved by this call's searches | the data marks supporting paragraphs (MuSiQue, HotpotQA) |
| ``rag.empty_query`` | empty queries of this call | a search with no query |
| ``rag.repeated_query`` | queries this episode already searched (case and spacing ignored) | |
| ``rag.answer_missing`` | 1.0 | the episode ended without an answer (still searching on its last call, or an empty reply) |
| ``rag.answer_malformed`` | 1.0 | a reply that was neither a search nor ``Answer: ...`` (the agent asked again; on the last call it was scored as a whole) |

A signal whose raw value is 0 is not emitted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentgym_lightning.hookspecs import hookimpl
from agentgym_lightning.trajectory import Reward, Step, Trajectory

#: outcome variable -> source, for the counted signals.
COUNTS: dict[str, str] = {
    "new_supporting": "rag.supporting",
    "empty_queries": "rag.empty_query",
    "repeated_queries": "rag.repeated_query",
}
#: answer_status -> source.
ANSWER: dict[str, str] = {"missing": "rag.answer_missing", "malformed": "rag.answer_malformed"}
#: Actions of a reply the agent could not read (it asked again).
NO_DIRECTIVE: tuple[str, ...] = ("no_directive", "bad_tool_call")
SOURCES: tuple[str, ...] = (*COUNTS.values(), *ANSWER.values())



@hookimpl
def agentgym_register_envs() -> list[dict[str, Any]]:
    return [
        {"id": "lightning/MuSiQue-v0", "entry_point": "agentgym_lightning.envs.rag.env:make_musique_env"},
        {"id": "lightning/HotpotQA-v0", "entry_point": "agentgym_lightning.envs.rag.env:make_hotpotqa_env"},
    ]


@hookimpl
def agentgym_intermediate_rewards(step: Step, trajectory: Trajectory, weights: Mapping[str, float]) -> list[Reward]:
    if not any(source in weights for source in SOURCES):
        return []
    outcome = step.outcome
    rewards = []
    for name, source in COUNTS.items():
        value = outcome.get(name)
        if source in weights and isinstance(value, int) and not isinstance(value, bool) and value > 0:
            rewards.append(Reward(value=float(value), source=source))
    status = outcome.get("answer_status")
    if outcome.get("action") in NO_DIRECTIVE:
        status = "malformed"
    source = ANSWER.get(status) if isinstance(status, str) else None
    if source is not None and source in weights:
        rewards.append(Reward(value=1.0, source=source))
    return rewards
