"""The LLM judge: a scripted judge over HTTP (the mock OpenAI server) ranks by a known rule."""

from __future__ import annotations

import json
import re

import pytest

from agentgym_lightning.judge import (
    GroupJudge,
    JudgeAnswerError,
    JudgeConfig,
    JudgeFailedWarning,
    agreement,
    approx_tokens,
    group_prompt,
    parse_scores,
)
from agentgym_lightning.llm import ChatRequest, Completion
from agentgym_lightning.testing.mock_openai_server import MockOpenAIServer, default_reply
from agentgym_lightning.trajectory import Status, Step, Trajectory


def episode(group: str, seed: int, answer: str, env_reward: float = 0.0, status: Status = Status.SUCCEEDED) -> Trajectory:
    step = Step(0, ChatRequest(messages=[{"role": "user", "content": "What is 6 * 7?"}]), completion=Completion(text=answer))
    return Trajectory(
        episode_id=f"{group}-{seed}",
        task={"question": "What is 6 * 7?", "answer": "42"},
        steps=[step],
        final_reward=env_reward,
        status=status,
        result=answer,
        group_id=group,
        seed=seed,
    )


def by_number_rule(body: dict) -> dict:
    """Scores each episode by how close its final answer is to 42 (the rule the test checks)."""
    user = body["messages"][1]["content"]
    answers = re.findall(r"Final answer: (.*)", user)
    scores = []
    for a in answers:
        try:
            scores.append(max(0.0, 1.0 - abs(float(a) - 42) / 42))
        except ValueError:
            scores.append(0.0)
    return default_reply(body, json.dumps({"scores": scores}))


def config(url: str, **kw) -> JudgeConfig:
    return JudgeConfig(base_url=url, model="scripted", **kw)


def test_rewards_follow_the_judges_rule_and_the_weight_mixes_the_env_reward():
    group = [episode("g", 0, "40", 0.0), episode("g", 1, "42", 1.0), episode("g", 2, "0", 0.0)]
    with MockOpenAIServer(by_number_rule) as server, GroupJudge(config(server.base_url, weight=0.5)) as judge:
        stats = judge.judge(group)
    assert stats.groups == 1 and stats.calls == 1 and stats.groups_failed == 0
    judged = [t.variables["judge"]["score"] for t in group]
    assert judged == pytest.approx([1 - 2 / 42, 1.0, 0.0])
    assert [t.final_reward for t in group] == pytest.approx([0.5 * (1 - 2 / 42), 0.5 * 1.0 + 0.5 * 1.0, 0.0])
    assert [t.variables["judge"]["env_reward"] for t in group] == [0.0, 1.0, 0.0]


def test_the_judge_never_sees_the_gold_answer_unless_asked():
    seen: list[dict] = []

    def record(body: dict) -> dict:
        seen.append(body)
        return by_number_rule(body)

    with MockOpenAIServer(record) as server:
        with GroupJudge(config(server.base_url)) as judge:
            judge.judge([episode("g", 0, "41"), episode("g", 1, "43")])
        with GroupJudge(config(server.base_url, show_gold=True)) as judge:
            judge.judge([episode("h", 0, "41"), episode("h", 1, "43")])
    assert "42" not in seen[0]["messages"][1]["content"].replace("6 * 7", "")
    assert '"answer": "42"' in seen[1]["messages"][1]["content"]


@pytest.mark.parametrize(
    "answer",
    ["the first one is better", json.dumps({"scores": [0.5]}), json.dumps({"scores": [0.5, 2.0]}), json.dumps({"scores": [0.1, 0.2], "why": "x"})],
)
def test_a_judge_that_answers_garbage_fails_its_group_only(answer):
    def garbage_for_group_b(body: dict) -> dict:
        if "Episode 1\nStatus: finished\nFinal answer: 7" in body["messages"][1]["content"]:
            return default_reply(body, answer)
        return by_number_rule(body)

    good = [episode("a", 0, "40"), episode("a", 1, "42")]
    bad = [episode("b", 0, "7"), episode("b", 1, "8")]
    with MockOpenAIServer(garbage_for_group_b) as server, GroupJudge(config(server.base_url, max_attempts=2)) as judge:
        with pytest.warns(JudgeFailedWarning, match="infra_failed"):
            stats = judge.judge(good + bad)
    assert stats.groups == 2 and stats.groups_failed == 1 and stats.bad_answers == 2 and stats.calls == 3
    assert all(t.status is Status.SUCCEEDED and "judge" in t.variables for t in good)
    assert all(t.status is Status.INFRA_FAILED and t.error.startswith("judge failed") and t.final_reward is None for t in bad)
    assert not any(t.trainable for t in bad)


def test_a_judge_that_times_out_or_errors_fails_the_group_with_a_clear_message():
    with MockOpenAIServer(delay=2.0) as server, GroupJudge(config(server.base_url, timeout_s=0.3, max_attempts=2)) as judge:
        group = [episode("g", 0, "1"), episode("g", 1, "2")]
        with pytest.warns(JudgeFailedWarning, match="Timeout"):
            stats = judge.judge(group)
    assert stats.call_errors == 2 and stats.groups_failed == 1
    assert all(t.status is Status.INFRA_FAILED and "Timeout" in t.error for t in group)
    with MockOpenAIServer(fail_next=5, fail_status=500) as server, GroupJudge(config(server.base_url, max_attempts=2)) as judge:
        group = [episode("g", 0, "1"), episode("g", 1, "2")]
        with pytest.warns(JudgeFailedWarning, match="InternalServerError"):
            judge.judge(group)
    assert all(t.status is Status.INFRA_FAILED for t in group)


def test_a_bad_answer_is_shown_back_and_a_good_second_answer_is_used():
    calls: list[dict] = []

    def second_time_right(body: dict) -> dict:
        calls.append(body)
        if len(calls) == 1:
            return default_reply(body, "Episode 2 is best.")
        return default_reply(body, '```json\n{"scores": [0.25, 0.75]}\n```')

    group = [episode("g", 0, "1"), episode("g", 1, "2")]
    with MockOpenAIServer(second_time_right) as server, GroupJudge(config(server.base_url)) as judge:
        stats = judge.judge(group)
    assert stats.calls == 2 and stats.bad_answers == 1 and stats.groups_failed == 0
    assert [t.final_reward for t in group] == [0.25, 0.75]
    assert "could not be used" in calls[1]["messages"][-1]["content"]


def test_scores_are_cached_by_content_so_a_resumed_run_does_not_rejudge(tmp_path):
    cache = tmp_path / "judge_cache.jsonl"
    with MockOpenAIServer(by_number_rule) as server:
        with GroupJudge(config(server.base_url), cache_path=cache) as judge:
            judge.judge([episode("g", 0, "40"), episode("g", 1, "42")])
        requests = server.state.requests
        # a "resumed run": a new judge over the same episodes (fresh objects), the same cache file
        replay = [episode("g", 1, "42"), episode("g", 0, "40")]  # finished in another order
        with GroupJudge(config(server.base_url), cache_path=cache) as judge:
            stats = judge.judge(replay)
        assert server.state.requests == requests
    assert stats.cache_hits == 1 and stats.calls == 0
    assert all(t.variables["judge"]["cached"] for t in replay)
    assert {t.seed: t.final_reward for t in replay} == pytest.approx({0: 1 - 2 / 42, 1: 1.0})


def test_the_prompt_stays_within_its_token_budget_and_says_what_was_cut():
    long = "x" * 40_000
    group = [episode("g", i, long + str(i)) for i in range(4)]
    cfg = JudgeConfig(base_url="http://127.0.0.1:9/v1", max_prompt_tokens=2000, transcript=True)
    prompt = group_prompt(group[0].task, group, cfg, approx_tokens)
    assert prompt.tokens <= 2000
    assert prompt.cut_chars > 0
    user = prompt.messages[1]["content"]
    assert "characters of this episode were cut" in user and "were cut to fit" in user
    for i in range(4):
        assert re.search(rf"Final answer: x+ \[\.\.\.\] x+{i}\n", user)  # each answer's start and end stay
    small = group_prompt(group[0].task, [episode("g", 0, "42")], cfg, approx_tokens)
    assert small.cut_chars == 0 and "cut" not in small.messages[1]["content"]


def test_streaming_judges_groups_as_they_complete_and_forwards_them():
    forwarded: list[Trajectory] = []
    with MockOpenAIServer(by_number_rule) as server, GroupJudge(config(server.base_url)) as judge:
        with judge.streaming(forwarded.append, group_size=2) as on_done:
            on_done(episode("a", 0, "42"))
            on_done(episode("b", 0, "40"))
            on_done(episode("a", 1, "0"))
            on_done(episode("c", 0, "42"))  # its group never completes: judged on leaving the block
        assert server.state.requests == 3
    assert sorted(t.episode_id for t in forwarded) == ["a-0", "a-1", "b-0", "c-0"]
    assert all("judge" in t.variables for t in forwarded)


@pytest.mark.parametrize("fmt", ["json_schema", "tool"])
def test_structured_answer_formats_are_requested_and_read(fmt):
    seen: list[dict] = []

    def structured(body: dict) -> dict:
        seen.append(body)
        reply = default_reply(body, json.dumps({"scores": [0.0, 1.0]}) if fmt == "json_schema" else "")
        if fmt == "tool":
            reply["choices"][0]["message"]["tool_calls"] = [
                {"id": "c1", "type": "function", "function": {"name": "submit_scores", "arguments": '{"scores": [0.0, 1.0]}'}}
            ]
            reply["choices"][0]["finish_reason"] = "tool_calls"
        return reply

    group = [episode("g", 0, "1"), episode("g", 1, "2")]
    with MockOpenAIServer(structured) as server, GroupJudge(config(server.base_url, answer_format=fmt)) as judge:
        judge.judge(group)
    assert [t.final_reward for t in group] == [0.0, 1.0]
    if fmt == "json_schema":
        assert seen[0]["response_format"]["type"] == "json_schema"
    else:
        assert seen[0]["tool_choice"]["function"]["name"] == "submit_scores"


def test_infra_failed_episodes_are_not_judged_and_a_judge_applies_once():
    failed = episode("g", 2, "99", status=Status.INFRA_FAILED)
    group = [episode("g", 0, "42"), episode("g", 1, "41"), failed]
    with MockOpenAIServer(by_number_rule) as server, GroupJudge(config(server.base_url)) as judge:
        judge.judge(group)
        judge.judge(group)  # already judged: not again, and not mixed twice
        assert server.state.requests == 1
    assert "judge" not in failed.variables and failed.final_reward == 0.0
    assert group[0].final_reward == 1.0


def test_parse_scores_is_strict():
    assert parse_scores('{"scores": [0, 0.5, 1]}', 3) == [0.0, 0.5, 1.0]
    assert parse_scores('```json\n{"scores": [1]}\n```', 1) == [1.0]
    for bad in ['{"scores": [NaN]}', '{"scores": [true]}', '{"scores": "1"}', "[1]", "", '{"scores": [1]} and more', "[" * 5000]:
        with pytest.raises(JudgeAnswerError):
            parse_scores(bad, 1)


def test_config_errors_name_the_option(tmp_path):
    with pytest.raises(ValueError, match="mode"):
        JudgeConfig(base_url="http://x/v1", mode="best")
    with pytest.raises(ValueError, match="weight"):
        JudgeConfig(base_url="http://x/v1", weight=2)
    with pytest.raises(ValueError, match="no such file"):
        JudgeConfig(base_url="http://x/v1", rubric="@" + str(tmp_path / "missing.txt"))
    rubric = tmp_path / "rubric.txt"
    rubric.write_text("Prefer short answers.")
    assert JudgeConfig(base_url="http://x/v1", rubric=f"@{rubric}").rubric == "Prefer short answers."
    binary = tmp_path / "rubric.bin"
    binary.write_bytes(b"Prefer \xff\xfe short answers.")
    # Before: "'utf-8' codec can't decode byte 0xff in position 7", naming no file and no way out.
    with pytest.raises(ValueError, match=rf"judge rubric @{re.escape(str(binary))}: not UTF-8 text \(byte 0xff at offset 7\): give a text file"):
        JudgeConfig(base_url="http://x/v1", rubric=f"@{binary}")
    with pytest.raises(ValueError, match="no such file"):
        JudgeConfig(base_url="http://x/v1", rubric=f"@{tmp_path}")  # a folder is no rubric file
    with pytest.raises(ValueError, match="unknown judge option"):
        JudgeConfig.from_dict({"base_url": "http://x/v1", "modle": "x"})
    with pytest.raises(ValueError, match="no URL serves it"):
        GroupJudge(JudgeConfig(base_url="policy"))


def test_agreement_counts_pairs_the_verifier_tells_apart():
    group = [episode("g", 0, "42", 1.0), episode("g", 1, "40", 0.0), episode("g", 2, "0", 0.0)]
    for t, score in zip(group, [0.9, 0.95, 0.1]):
        t.variables["judge"] = {"score": score, "env_reward": t.final_reward}
    result = agreement(group)
    # pairs the verifier tells apart: (0,1) judge wrong, (0,2) judge right
    assert result["pairs"] == 2 and result["pairwise_accuracy"] == 0.5
    assert result["groups"] == 1


@pytest.mark.parametrize("cached", [[5.0, 1.0], [-1e6, 0.5], [float("nan"), 0.5], [1e300, 0.5]])
def test_cached_scores_are_checked_as_fresh_ones_and_a_bad_one_is_judged_again(tmp_path, cached):
    cache = tmp_path / "judge_cache.jsonl"
    with MockOpenAIServer(by_number_rule) as server:
        with GroupJudge(config(server.base_url), cache_path=cache) as judge:
            judge.judge([episode("g", 0, "40"), episode("g", 1, "42")])
        key = json.loads(cache.read_text(encoding="utf-8"))["key"]
        cache.write_text(json.dumps({"key": key, "scores": cached}) + "\n", encoding="utf-8")  # an edited cache file
        replay = [episode("g", 0, "40"), episode("g", 1, "42")]
        with GroupJudge(config(server.base_url), cache_path=cache) as judge:
            stats = judge.judge(replay)
    # Before: the cached 5.0 or -1e6 became a reward, and NaN or 1e300 raised out of the judge.
    assert stats.cache_hits == 0 and stats.calls == 1 and stats.groups_failed == 0
    assert [t.final_reward for t in replay] == pytest.approx([1 - 2 / 42, 1.0])


def test_the_judge_never_sees_the_environments_verdict_unless_asked():
    # Arithmetic's result carries its verifier's verdict ("correct": false) and its metrics variable;
    # RAG's result its measured f1: a judge shown them copies the verifier instead of judging.
    seen: list[str] = []

    def record(body: dict) -> dict:
        seen.append(body["messages"][1]["content"])
        return default_reply(body, json.dumps({"scores": [0.5, 0.5]}))

    def verified(group: str, seed: int, answer: str, correct: bool) -> Trajectory:
        t = episode(group, seed, answer, float(correct))
        t.result = {"correct": correct, "answer": answer, "f1": float(correct), "calculator_calls": 1}
        t.variables["metrics"] = {"correct": float(correct), "f1": float(correct)}
        t.steps[0].outcome["metrics"] = {"correct": float(correct)}
        t.steps[0].outcome["tool_result"] = "42"
        return t

    with MockOpenAIServer(record) as server:
        with GroupJudge(config(server.base_url, transcript=True)) as judge:
            judge.judge([verified("g", 0, "41", False), verified("g", 1, "42", True)])
        with GroupJudge(config(server.base_url, transcript=True, show_verdict=True)) as judge:
            judge.judge([verified("h", 0, "41", False), verified("h", 1, "42", True)])
    hidden, shown = seen
    assert '"answer": "41"' in hidden and '"calculator_calls": 1' in hidden and "then tool_result: 42" in hidden
    assert "correct" not in hidden and "f1" not in hidden and "metrics" not in hidden
    assert '"correct": false' in shown and '"f1": 0.0' in shown and "then metrics:" in shown


def test_a_judged_episodes_success_is_the_environments_verdict_not_a_positive_score():
    from agentgym_lightning.metrics import success_meaning, summarize

    # Zero correct answers, every judge score positive: success_rate must say 0, not 1.
    group = [episode("g", 0, "40", 0.0), episode("g", 1, "41", 0.0), episode("g", 2, "43", 0.0)]
    with MockOpenAIServer(by_number_rule) as server, GroupJudge(config(server.base_url)) as judge:
        judge.judge(group)
    assert all(t.final_reward > 0 for t in group)
    assert summarize(group, 1.0)["success_rate"] == 0.0
    group[1].variables["judge"]["env_reward"] = 1.0  # one the verifier passed
    assert summarize(group, 1.0)["success_rate"] == pytest.approx(1 / 3)
    # No verifier at all (the env's reward None): the judge says, at a score of at least 0.5.
    for t, score in zip(group, (0.9, 0.2, 0.5)):
        t.variables["judge"].update(env_reward=None, score=score)
    assert summarize(group, 1.0)["success_rate"] == pytest.approx(2 / 3)
    assert "env's own reward" in success_meaning(True) and "final reward > 0" in success_meaning(False)
