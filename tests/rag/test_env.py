"""The RAG envs end to end on the bundled sample (real embedding model, scripted policies):
tool calls and the text protocol, one growing conversation, rewards, AIR, check_env."""

from __future__ import annotations

import json
import warnings
from typing import Any

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

pytest.importorskip("chromadb", reason="needs the [rag] extra")

import agentgym_lightning  # noqa: E402,F401 - registers the ids
from agentgym_lightning import Completion, Status, ToolCall  # noqa: E402
from agentgym_lightning.envs.rag.agent import LAST_CALL, parse_reply  # noqa: E402
from agentgym_lightning.envs.rag.data import RagDataWarning  # noqa: E402
from agentgym_lightning.envs.rag.env import ENV_IDS, RagReward, make_env  # noqa: E402


@pytest.fixture
def sample_env(real_embedder):
    made = []

    def build(dataset: str = "musique", **kwargs: Any):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RagDataWarning)
            env = make_env(dataset, embedding_model=real_embedder, **kwargs)
        made.append(env)
        return env

    yield build
    for env in made:
        env.close()


def search_call(query: str, call_id: str = "call_1") -> Completion:
    return Completion(text="", tool_calls=[ToolCall(call_id, "search", json.dumps({"query": query}))],
                      finish_reason="tool_calls")


def play(env, actions, **options):
    obs, info = env.reset(options=options)
    observations, rewards = [obs], []
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        rewards.append(reward)
        if terminated or truncated:
            return info["trajectory"], rewards, observations
        observations.append(obs)
    raise AssertionError("the episode did not end")


def test_scripted_multi_hop_episode_with_tool_calls_and_text(sample_env):
    env = sample_env(air_weights={"rag.supporting": 0.1})
    task0 = env.tasks[0]  # Who founded the town on the northern shore of Lake Orvell? -> Aldric Vane
    hop1, hop2 = (s["question"] for s in task0["sub_questions"])
    trajectory, rewards, observations = play(
        env, [search_call(hop1), f"Search: {hop2}", "I found it.\nAnswer: Aldric Vane."], task_index=0)
    assert trajectory.status is Status.SUCCEEDED and trajectory.final_reward == 1.0
    assert trajectory.variables["metrics"] == {"f1": 1.0, "em": 1.0, "support_recall": 1.0}
    assert trajectory.result["answer"] == "Aldric Vane." and trajectory.result["answer_status"] == "ok"
    assert [s.trainable for s in trajectory.steps] == [True, True, True]
    assert [s.role for s in trajectory.steps] == ["searcher"] * 3
    assert [s.outcome["action"] for s in trajectory.steps] == ["search", "search", "answer"]

    # One conversation: every request is the previous one plus the reply and what followed it.
    requests = [s.request for s in trajectory.steps]
    assert requests[0].tools and requests[0].tools[0]["function"]["name"] == "search"
    for before, after in zip(requests, requests[1:]):
        assert after.messages[: len(before.messages)] == before.messages
    _, _, assistant, tool = requests[1].messages
    assert assistant["tool_calls"][0]["function"]["name"] == "search" and tool["role"] == "tool"
    assert tool["tool_call_id"] == assistant["tool_calls"][0]["id"]
    assert tool["content"].startswith("[1] ") and tool["content"].count("\n[") == 2  # top 3 passages
    assert "Lake Orvell" in tool["content"]
    assert requests[2].messages[-2] == {"role": "assistant", "content": f"Search: {hop2}"}
    assert requests[2].messages[-1]["role"] == "user" and "Dunmere" in requests[2].messages[-1]["content"]

    # Both supporting passages were first found by the first search: rag.supporting 2 x 0.1 there.
    assert trajectory.steps[0].outcome["new_supporting"] == 2
    assert [(r.source, r.raw) for r in trajectory.steps[0].rewards] == [("rag.supporting", 2.0)]
    assert rewards == pytest.approx([0.2, 0.0, 1.0]) and trajectory.total_reward == pytest.approx(1.2)


def test_passages_are_truncated_and_the_last_call_is_announced(sample_env):
    env = sample_env(max_turns=2, top_k=2, max_passage_chars=40)
    trajectory, rewards, observations = play(env, ["Search: Dunmere", "Search: Aldric Vane"], task_index=0)
    results = observations[1].request.messages[-1]["content"]
    first_line = results.splitlines()[0]
    assert first_line.startswith("[1] Dunmere: ") and first_line.endswith(" ...")
    assert len(first_line.split(": ", 1)[1]) <= 40 + 4 and results.count("\n[") == 1
    assert results.endswith(LAST_CALL)
    # Still searching on its last call: no answer, reward 0, flagged missing.
    assert trajectory.status is Status.SUCCEEDED and trajectory.final_reward == 0.0
    assert trajectory.result["answer"] is None and trajectory.steps[-1].outcome["answer_status"] == "missing"
    assert len(trajectory.steps) == 2


def test_air_signals_for_queries_and_answers(sample_env):
    weights = {"rag.empty_query": -0.1, "rag.repeated_query": -0.2, "rag.answer_malformed": -0.3}
    env = sample_env(air_weights=weights, max_turns=6)
    actions = [
        search_call("", "c1"),                    # empty query: an error message, no search
        search_call("who founded Dunmere", "c2"),
        "Search:  Who founded   DUNMERE ",         # the same query again (case, spacing)
        Completion(text="", tool_calls=[ToolCall("c3", "lookup", "{}")], finish_reason="tool_calls"),
        "Let me think.",                          # no directive: a reminder, flagged malformed
        "Aldric Vane founded it",                 # no directive on the last call: scored whole
    ]
    trajectory, rewards, observations = play(env, actions, task_index=0)
    assert "the query is empty" in observations[1].request.messages[-1]["content"]
    assert "no tool 'lookup'" in observations[4].request.messages[-1]["content"]
    sources = [[(r.source, r.value) for r in s.rewards] for s in trajectory.steps]
    assert "Use the search tool, or reply" in observations[5].request.messages[-1]["content"]
    assert sources == [[("rag.empty_query", -0.1)], [], [("rag.repeated_query", -0.2)], [],
                       [("rag.answer_malformed", -0.3)], [("rag.answer_malformed", -0.3)]]
    assert trajectory.result["answer_status"] == "malformed"
    assert [s.outcome["action"] for s in trajectory.steps] == [
        "search", "search", "search", "unknown_tool", "no_directive", "answer"]
    assert trajectory.variables["metrics"]["f1"] == pytest.approx(2 * 0.5 * 1.0 / 1.5)  # "aldric vane" of 4 tokens


def test_air_is_off_without_weights_and_em_reward(sample_env):
    env = sample_env(reward="em")
    trajectory, rewards, _ = play(env, [search_call(""), "Answer: Vane"], task_index=0)
    assert all(not s.rewards for s in trajectory.steps)
    assert trajectory.final_reward == 0.0 and trajectory.variables["metrics"]["f1"] == pytest.approx(2 / 3)
    assert RagReward("em")({"answers": ["Aldric Vane"]}, "aldric vane") == 1.0
    with pytest.raises(ValueError, match="unknown answer reward"):
        RagReward("bleu")


def test_text_mode_sends_no_tools_and_a_malformed_tool_call_gets_a_retry(sample_env):
    env = sample_env("hotpotqa", tool_mode="text")
    trajectory, _, observations = play(
        env, ['<tool_call>{"name": "search", "arguments": {"query": </tool_call>', 'search("Pellam Observatory")',
              "Answer: Ottilie Marsh"], task_index=10)
    assert observations[0].request.tools is None and "Search: <query>" in observations[0].request.messages[0]["content"]
    assert "could not be read" in observations[1].request.messages[-1]["content"]
    assert "[1] Pellam Observatory" in observations[2].request.messages[-1]["content"]
    assert trajectory.env_id == "lightning/HotpotQA-v0"
    assert trajectory.final_reward == 0.0  # the question asks for Dunmere


def test_parse_reply_text_protocol():
    assert parse_reply("Thinking...\nSearch: capital of Kestria\nAnswer: x").kind == "search"
    assert parse_reply("**Answer:** Marrowgate").value == "Marrowgate"
    assert parse_reply("answer: 1888\nmore text").value.splitlines()[0] == "1888"
    assert parse_reply("search(query='Mount Corra')").value == "Mount Corra"
    assert parse_reply("The answer is Marrowgate.").kind == "none"


@pytest.mark.parametrize("dataset", list(ENV_IDS))
def test_check_env_on_each_registered_id(dataset, real_embedder):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RagDataWarning)
        env = gym.make(ENV_IDS[dataset], embedding_model=real_embedder)
    try:
        check_env(env.unwrapped)
        obs, info = env.reset(seed=0)
        assert obs in env.observation_space and info["task"]["question"].endswith("?")
    finally:
        env.close()


def test_shared_data_env_on_a_slice(musique_dir, real_embedder, tmp_path):
    """The real MuSiQue questions, with a corpus of the first questions' own paragraphs."""
    from agentgym_lightning.envs.rag.data import load_musique
    from agentgym_lightning.envs.rag.index import PassageIndex
    from agentgym_lightning.envs.rag.retriever import Retriever

    data = load_musique(data_dir=musique_dir)
    tasks = data.tasks()[:3]
    wanted = {pid for t in tasks for pid in t["supporting_ids"]}
    corpus = [p for p in data.corpus if p.id in wanted] + data.corpus[:30]
    retriever = Retriever(PassageIndex.open(corpus, real_embedder, tmp_path, progress=False))
    env = make_env("musique", data_dir=str(musique_dir), limit=3, retriever=retriever)
    try:
        first = tasks[0]
        trajectory, _, _ = play(env, [f"Search: {first['sub_questions'][0]['question']}",
                                      f"Search: {first['sub_questions'][1]['question']}",
                                      f"Answer: {first['answers'][1]}"], task_index=0)
        assert trajectory.final_reward == 1.0 and trajectory.variables["metrics"]["support_recall"] == 1.0
    finally:
        env.close()
        retriever.close()


def test_offset_holds_out_the_tail_of_a_one_split_data_set(hash_embedder):
    import warnings

    from agentgym_lightning.envs.rag.data import RagDataWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RagDataWarning)
        whole = make_env("musique", embedding_model=hash_embedder)
        train = make_env("musique", embedding_model=hash_embedder, limit=3)
        held_out = make_env("musique", embedding_model=hash_embedder, offset=3, limit=2)
    try:
        ids = [t["id"] for t in whole.tasks]
        assert [t["id"] for t in train.tasks] == ids[:3]
        assert [t["id"] for t in held_out.tasks] == ids[3:5]
        with pytest.raises(ValueError, match=rf"offset must be 0 to {len(ids) - 1} \({len(ids)} questions in dev\), got {len(ids)}"):
            make_env("musique", embedding_model=hash_embedder, offset=len(ids))
    finally:
        for env in (whole, train, held_out):
            env.close()


def test_shuffle_seed_orders_the_questions_before_the_slice(hash_embedder):
    import warnings

    from agentgym_lightning.envs.rag.data import RagDataWarning

    envs = []

    def ids(**kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RagDataWarning)
            envs.append(make_env("musique", embedding_model=hash_embedder, **kwargs))
        return [t["id"] for t in envs[-1].tasks]

    try:
        whole = ids()
        shuffled = ids(shuffle_seed=0)
        assert sorted(shuffled) == sorted(whole) and shuffled != whole
        assert ids(shuffle_seed=0) == shuffled  # a fixed order
        assert ids(shuffle_seed=0, limit=4) + ids(shuffle_seed=0, offset=4) == shuffled  # halves of one order
    finally:
        for env in envs:
            env.close()
