"""``gym.make("lightning/Spider-v0", agent="langgraph")``: the LangGraph write → check → rewrite
graph, its calls named by node, and selective training (writer and rewriter, not the checker)."""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("langgraph", reason="needs the [langchain] extra")

import gymnasium as gym  # noqa: E402

import agentgym_lightning  # noqa: E402,F401 - registers the ids
from agentgym_lightning import Status  # noqa: E402
from agentgym_lightning.envs.spider.data import SpiderDataWarning  # noqa: E402
from agentgym_lightning.envs.spider.env import gold_policy  # noqa: E402


@pytest.fixture(scope="module")
def sample_dir(tmp_path_factory):
    """The bundled sample built into a folder of its own (passed as data_dir, so the once-per-process
    "no Spider data" notice stays for the test that checks it)."""
    from agentgym_lightning.envs.spider.sample import build_sample

    return build_sample(tmp_path_factory.mktemp("spider-sample"))


@pytest.fixture
def make(sample_dir):
    def build(agent, **kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SpiderDataWarning)
            return gym.make("lightning/Spider-v0", agent=agent, limit=3, data_dir=str(sample_dir), **kwargs)

    return build


def play(env, policy, task_index=0):
    obs, info = env.reset(seed=0, options={"task_index": task_index})
    task, done, total = info["task"], False, 0.0
    while not done:
        obs, reward, terminated, truncated, info = env.step(policy(obs, task))
        total += reward
        done = terminated or truncated
    return info["trajectory"], total


def doubting_policy(obs, task):
    """Wrong SQL first; the checker rejects it once, the rewriter then writes the gold."""
    role = obs.request.metadata.get("role") or obs.request.metadata.get("agent")
    if role == "checker":
        first = "SELECT 0" in str(obs.request.messages)
        return "Wrong table.\nVERDICT: INCORRECT" if first else "VERDICT: CORRECT"
    if role == "rewriter":
        return f"```sql\n{task['query']}\n```"
    return "```sql\nSELECT 0\n```"


def test_langgraph_agent_answers_like_the_from_scratch_one(make):
    """Same policy, same prompts call for call, same rewards; only who marks trainability differs."""
    runs = {}
    for agent in ("scratch", "langgraph"):
        env = make(agent)
        try:
            runs[agent] = play(env, doubting_policy)
        finally:
            env.close()
    (scratch, r_scratch), (graph, r_graph) = runs["scratch"], runs["langgraph"]
    assert graph.status is Status.SUCCEEDED, graph.error
    assert r_graph == r_scratch == 1.0
    assert [s.agent for s in graph.steps] == ["writer", "checker", "rewriter", "checker"]
    assert [s.role for s in scratch.steps] == ["writer", "checker", "rewriter", "checker"]
    for a, b in zip(scratch.steps, graph.steps, strict=True):
        assert a.request.messages == b.request.messages
        assert a.outcome == b.outcome  # sql, sql_status, sql_error, check: the same signals
    # agent_match="writer|rewriter" (the default) reproduces the paper's choice the scratch agent hard-codes.
    assert [s.trainable for s in graph.steps] == [s.trainable for s in scratch.steps] == [True, False, True, False]
    assert graph.steps[1].completion is not None  # the checker's calls are answered and recorded all the same


def test_agent_match_selects_the_trained_nodes(make):
    env = make("langgraph", agent_match={"agent": "checker"})
    try:
        trajectory, _ = play(env, doubting_policy)
    finally:
        env.close()
    assert [s.trainable for s in trajectory.steps] == [False, True, False, True]
    env = make("langgraph", train_checker=True)  # every node trains
    try:
        trajectory, total = play(env, gold_policy)
    finally:
        env.close()
    assert total == 1.0 and [s.trainable for s in trajectory.steps] == [True, True]


def test_unknown_agent_is_refused(make):
    with pytest.raises(ValueError, match="choose one of scratch, langgraph"):
        make("crewai")


def test_both_agents_read_the_writers_system_prompt_from_the_episode(make):
    template = "Answer with SQLite only.\nTables:\n{schema}"
    systems = {}
    for agent in ("scratch", "langgraph"):
        env = make(agent, resources={"system_prompt": template})
        try:
            obs, _ = env.reset(seed=0, options={"task_index": 0})
            systems[agent] = obs.request.messages[0]["content"]
        finally:
            env.close()
    assert systems["langgraph"] == systems["scratch"]
    assert systems["scratch"].startswith("Answer with SQLite only.\nTables:\n") and "CREATE TABLE" in systems["scratch"]
