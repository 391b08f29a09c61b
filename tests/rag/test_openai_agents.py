"""``gym.make("lightning/MuSiQue-v0", agent="openai-agents")``: the searcher as an OpenAI Agents SDK
agent, on the bundled sample, with a scripted policy and the same signals as the from-scratch one."""

from __future__ import annotations

import json
import warnings

import pytest

pytest.importorskip("chromadb", reason="needs the [rag] extra")
pytest.importorskip("agents", reason="needs the [openai-agents] extra")

from agentgym_lightning import Completion, Status, ToolCall  # noqa: E402
from agentgym_lightning.envs.rag.agent import LAST_CALL  # noqa: E402
from agentgym_lightning.envs.rag.data import RagDataWarning  # noqa: E402
from agentgym_lightning.envs.rag.env import make_env  # noqa: E402


def build(agent, embedder, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RagDataWarning)
        return make_env("musique", embedding_model=embedder, agent=agent, **kwargs)


def search(query, call_id):
    return Completion(text="", tool_calls=[ToolCall(call_id, "search", json.dumps({"query": query}))],
                      finish_reason="tool_calls")


def play(env, actions):
    obs, info = env.reset(seed=0, options={"task_index": 0})
    requests, rewards = [obs.request], []
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        rewards.append(reward)
        if terminated or truncated:
            return info["trajectory"], rewards, requests
        requests.append(obs.request)
    raise AssertionError("the episode did not end")


def play_both(embedder, actions, **kwargs):
    """The same actions (a list, or ``fn(env) -> list``) played with the from-scratch agent and
    with the SDK agent: ``[(trajectory, rewards, requests)] * 2``, in that order."""
    results = []
    for agent in ("scratch", "openai-agents"):
        env = build(agent, embedder, **kwargs)
        try:
            results.append(play(env, actions(env) if callable(actions) else actions))
        finally:
            env.close()
    return results


def calls_of(message):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls") or []]


@pytest.mark.parametrize(("examples", "max_turns"), [(0, 4), (2, 4), (0, 3)])
def test_sdk_searcher_matches_the_from_scratch_one(hash_embedder, examples, max_turns):
    """With ``max_turns=3`` the third call is the last: the second search's results end with
    the from-scratch agent's "no searches left" line in both."""
    def two_searches_then_the_answer(env):
        hop1, hop2 = (s["question"] for s in env.tasks[0]["sub_questions"])
        return [search(hop1, "c1"), search(hop2, "c2"), "Answer: Aldric Vane"]

    (scratch, r_scratch, q_scratch), (sdk, r_sdk, q_sdk) = play_both(
        hash_embedder, two_searches_then_the_answer, air_weights={"rag.supporting": 0.1}, examples=examples, max_turns=max_turns)
    assert sdk.status is Status.SUCCEEDED, sdk.error
    assert sdk.variables["metrics"] == scratch.variables["metrics"] and sdk.final_reward == 1.0
    assert r_sdk == pytest.approx(r_scratch)  # AIR and the final reward land on the same calls
    assert [s.agent for s in sdk.steps] == ["searcher"] * 3
    assert [s.outcome.get("action") for s in sdk.steps] == [s.outcome.get("action") for s in scratch.steps]
    assert sdk.result["retrieved"] == scratch.result["retrieved"]
    # The SDK sends the same instructions, question, tool and tool results, in OpenAI format.
    for a, b in zip(q_scratch, q_sdk, strict=True):
        assert [m["role"] for m in a.messages] == [m["role"] for m in b.messages]
        assert [m.get("content") for m in a.messages if m["role"] != "assistant"] == \
               [m.get("content") for m in b.messages if m["role"] != "assistant"]
        assert [calls_of(m) for m in a.messages] == [calls_of(m) for m in b.messages]
        assert b.tools[0]["function"]["name"] == "search"
        assert b.tools[0]["function"]["parameters"]["required"] == ["query"]
    last_result = q_sdk[-1].messages[-1]
    assert last_result["role"] == "tool" and last_result["content"].endswith(LAST_CALL) == (max_turns == 3)


def test_out_of_turns_is_a_missing_answer(hash_embedder):
    env = build("openai-agents", hash_embedder, max_turns=2)
    try:
        trajectory, rewards, _ = play(env, [search("Dunmere", "c1"), search("Aldric", "c2")])
    finally:
        env.close()
    assert trajectory.status is Status.SUCCEEDED and trajectory.final_reward == 0.0
    assert trajectory.result["answer_status"] == "missing" and len(trajectory.steps) == 2


def test_a_call_of_a_tool_it_does_not_have_ends_the_run_without_an_answer(hash_embedder):
    # The SDK raises ModelBehaviorError; the episode is the model's failure, scored 0, not a crash.
    env = build("openai-agents", hash_embedder, air_weights={"rag.answer_malformed": -0.5})
    try:
        bad = Completion(text="", tool_calls=[ToolCall("c1", "JPJ", "{}")], finish_reason="tool_calls")
        trajectory, rewards, _ = play(env, [search("Dunmere", "c0"), bad])
    finally:
        env.close()
    assert trajectory.status is Status.SUCCEEDED, trajectory.error
    assert trajectory.final_reward == 0.0 and rewards[-1] == -0.5
    assert trajectory.result["answer"] is None and trajectory.result["answer_status"] == "malformed"
    assert trajectory.result["calls"] == len(trajectory.steps) == 2
    assert trajectory.steps[-1].outcome["action"] == "bad_tool_call"


def test_text_protocol_is_refused_for_the_sdk_agent(hash_embedder):
    with pytest.raises(ValueError, match="tool_mode must be 'tools'"):
        build("openai-agents", hash_embedder, tool_mode="text")


def test_worked_examples_are_real_turns_before_the_question(hash_embedder):
    from agentgym_lightning.envs.rag.agent import EXAMPLES
    from agentgym_lightning.policies.chat import prepare_messages

    firsts = {}
    for agent in ("scratch", "openai-agents"):
        env = build(agent, hash_embedder, examples=1)
        try:
            obs, _ = env.reset(seed=0, options={"task_index": 0})
            firsts[agent] = obs.request
            question = env.tasks[0]["question"]
        finally:
            env.close()
    messages = firsts["scratch"].messages
    # system, then the example: question, two searches with their results, the answer; then the question
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant", "user"]
    (example_question, searches, answer) = EXAMPLES[0]
    assert example_question in messages[1]["content"] and messages[-1]["content"] == f"Question: {question}"
    assert [calls_of(m) for m in messages[2:6:2]] == [[("search", {"query": q})] for q, _ in searches]
    assert [m["content"] for m in messages[3:7:2]] == [r for _, r in searches]
    assert messages[6]["content"] == f"Answer: {answer}"
    # With the compact tool prompt a model without template tools reads the SDK's conversation
    # exactly as the from-scratch one's (the full prompt pastes each tool's JSON schema, and the
    # SDK's has a "title" the hand-written one lacks).
    assert prepare_messages(firsts["openai-agents"], native_tools=False, tool_prompt="compact") == \
           prepare_messages(firsts["scratch"], native_tools=False, tool_prompt="compact")


def test_examples_out_of_range_are_refused(hash_embedder):
    with pytest.raises(ValueError, match="examples must be 0 to 2, got 3"):
        build("scratch", hash_embedder, examples=3)


@pytest.mark.parametrize("arguments", ['{"q": "Dunmere"}', "Dunmere, please", '{"query": 7}'])
def test_arguments_the_sdk_cannot_read_are_answered_as_the_from_scratch_agent_does(hash_embedder, arguments):
    # The SDK's default would tell the model only "An error occurred while running the tool".
    bad = Completion(text="", tool_calls=[ToolCall("c1", "search", arguments)], finish_reason="tool_calls")
    (scratch, r_scratch, q_scratch), (sdk, r_sdk, q_sdk) = play_both(
        hash_embedder, [bad, "Answer: Aldric Vane"], air_weights={"rag.empty_query": -0.1, "rag.supporting": 0.1})
    assert sdk.status is Status.SUCCEEDED, sdk.error
    assert r_sdk == pytest.approx(r_scratch)
    assert q_sdk[1].messages[-1]["role"] == "tool"
    assert q_sdk[1].messages[-1]["content"] == q_scratch[1].messages[-1]["content"]
    assert sdk.result["retrieved"] == scratch.result["retrieved"]


def test_a_failing_index_fails_the_episode_with_its_message(hash_embedder):
    # Not the model's fault: the episode must not go on as if the search had answered.
    class BrokenIndex:
        def search(self, query, k):
            raise RuntimeError("the index is gone")

        def close(self):
            pass

    env = build("openai-agents", hash_embedder, retriever=BrokenIndex())
    try:
        trajectory, _, _ = play(env, [search("Dunmere", "c1"), "Answer: Aldric Vane"])
    finally:
        env.close()
    assert trajectory.status is not Status.SUCCEEDED
    assert "the index is gone" in (trajectory.error or "")
