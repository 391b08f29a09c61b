"""envs/rag/plugin.py: outcome variables of the RAG agent -> weighted AIR signals."""

from __future__ import annotations

from agentgym_lightning.llm import ChatRequest
from agentgym_lightning.envs.rag import plugin as rag_air
from agentgym_lightning.plugin_manager import env_plugins
from agentgym_lightning.trajectory import Step, Trajectory


def step(**outcome) -> Step:
    return Step(index=0, request=ChatRequest.from_openai({"model": "m", "messages": [{"role": "user", "content": "q"}]}), outcome=outcome)


ALL = {source: 1.0 for source in rag_air.SOURCES}


def signals(outcome: dict, weights=ALL) -> list[tuple[str, float]]:
    return [(r.source, r.value) for r in rag_air.agentgym_intermediate_rewards(step(**outcome), Trajectory("e"), weights)]


def test_signals_from_the_outcome():
    assert "agentgym_lightning.envs.rag.plugin" in env_plugins()
    search = {"action": "search", "new_supporting": 2, "empty_queries": 0, "repeated_queries": 1}
    assert signals(search) == [("rag.supporting", 2.0), ("rag.repeated_query", 1.0)]
    assert signals({"action": "search", "empty_queries": 1}) == [("rag.empty_query", 1.0)]
    assert signals({"action": "answer", "answer_status": "missing"}) == [("rag.answer_missing", 1.0)]
    assert signals({"action": "answer", "answer_status": "malformed"}) == [("rag.answer_malformed", 1.0)]
    assert signals({"action": "no_directive"}) == [("rag.answer_malformed", 1.0)]
    assert signals({"action": "bad_tool_call"}) == [("rag.answer_malformed", 1.0)]
    assert signals({"action": "answer", "answer_status": "ok"}) == []


def test_only_weighted_sources_and_nothing_from_other_envs():
    search = {"new_supporting": 1, "repeated_queries": 3}
    assert signals(search, {"rag.repeated_query": -0.1}) == [("rag.repeated_query", 3.0)]
    assert signals(search, {}) == [] and signals(search, {"spider.no_sql": -1.0}) == []
    assert signals({"sql_status": "no_sql", "new_supporting": True}) == []  # a bool is not a count
