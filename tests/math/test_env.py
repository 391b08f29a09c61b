"""The math envs end to end: multi-turn calculator episodes, both protocols, AIR, token continuity."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import agentgym_lightning  # noqa: F401 - registers the ids
from agentgym_lightning import Status
from agentgym_lightning.envs.math.agent import CALCULATOR_TOOL, MathAgentConfig, run_tool_call
from agentgym_lightning.envs.math.data import MathDataWarning
from agentgym_lightning.envs.math.env import (
    MathReward,
    calculator_policy,
    make_arithmetic_env,
    make_calcx_env,
    make_gsm8k_env,
)
from agentgym_lightning.llm import Completion, ToolCall
from agentgym_lightning.policies.tool_calls import new_tool_call_id

from .conftest import play

ALL_AIR = {"math.calc_ok": 0.1, "math.calc_error": -0.1, "math.answer_missing": -0.5, "math.answer_unparsable": -0.3, "math.no_tool": -0.05}


def rewards_by_source(trajectory):
    return [{r.source: r.value for r in step.rewards} for step in trajectory.steps]


@pytest.mark.parametrize("protocol", ["tools", "text"])
def test_scripted_calculator_episode_continues_one_conversation(protocol):
    env = make_arithmetic_env(difficulty=3, split="test", protocol=protocol, air_weights=ALL_AIR)
    try:
        trajectory, observations, total = play(env, calculator_policy, task_index=0)
    finally:
        env.close()
    task = trajectory.task
    assert trajectory.status is Status.SUCCEEDED and trajectory.final_reward == 1.0
    assert len(trajectory.steps) == 2 and all(s.trainable for s in trajectory.steps)
    first, second = (o.request for o in observations)
    # each prompt extends the last: the same messages, plus the reply and the tool result
    assert second.messages[: len(first.messages)] == first.messages
    added = second.messages[len(first.messages):]
    if protocol == "tools":
        assert first.tools == [CALCULATOR_TOOL]
        assert [m["role"] for m in added] == ["assistant", "tool"]
        assert added[0]["tool_calls"][0]["id"] == added[1]["tool_call_id"]
        assert added[1]["content"] == task["answer"]
    else:
        assert first.tools is None and '"name": "calculator"' in first.messages[0]["content"]
        assert [m["role"] for m in added] == ["assistant", "user"]
        assert added[1]["content"] == f"<tool_response>\n{task['answer']}\n</tool_response>"
    assert trajectory.steps[0].outcome["calculator"] == [{"expression": task["expression"], "result": task["answer"]}]
    assert trajectory.steps[1].outcome["answer_status"] == "ok"
    assert trajectory.variables["metrics"] == {"correct": 1.0, "used_calculator": 1.0, "answer_parsed": 1.0}
    assert rewards_by_source(trajectory) == [{"math.calc_ok": pytest.approx(0.1)}, {}]
    assert total == pytest.approx(1.1)


def test_calculator_errors_and_malformed_calls_go_back_to_the_model():
    replies = iter([
        '<tool_call>{"name": "calculator", "arguments": {"expression": "__import__(\'os\')"}}</tool_call>',
        '<tool_call>{"name": "calculator", "arguments": {"expression": "7 *"</tool_call>',  # bad JSON
        "Answer: 13",
    ])
    env = make_arithmetic_env(split="test", protocol="text", max_turns=3, air_weights=ALL_AIR)
    try:
        trajectory, observations, _ = play(env, lambda obs, task: next(replies), task_index=0)
    finally:
        env.close()
    shown = [o.request.messages[-1]["content"] for o in observations[1:]]
    assert shown[0].startswith("<tool_response>\nError: character '_' is not allowed")
    assert "Error: the tool call could not be read" in shown[1]
    outcomes = [s.outcome for s in trajectory.steps]
    assert outcomes[0]["calculator"][0]["error"] == "forbidden"
    assert outcomes[1]["calculator"][0]["error"] == "malformed"
    assert rewards_by_source(trajectory)[:2] == [{"math.calc_error": pytest.approx(-0.1)}] * 2
    assert trajectory.result["calculator_calls"] == 2 and trajectory.result["calculator_errors"] == 2


def test_running_out_of_turns_is_a_missing_answer():
    always_calls = '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>'
    env = make_arithmetic_env(split="test", max_turns=2, air_weights=ALL_AIR)  # text protocol by default
    try:
        trajectory, _, _ = play(env, lambda obs, task: always_calls)
    finally:
        env.close()
    assert trajectory.status is Status.SUCCEEDED and len(trajectory.steps) == 2
    assert trajectory.steps[-1].outcome["answer_status"] == "missing"
    assert trajectory.final_reward == 0.0
    assert rewards_by_source(trajectory)[-1] == {"math.calc_ok": pytest.approx(0.1), "math.answer_missing": pytest.approx(-0.5)}


def test_answer_without_tools_is_reported_with_weight_zero_by_default():
    env = make_arithmetic_env(split="test")
    try:
        trajectory, _, total = play(env, lambda obs, task: f"I think it is {task['answer']}.", task_index=1)
    finally:
        env.close()
    assert trajectory.final_reward == 1.0 and total == 1.0
    (step,) = trajectory.steps
    assert [(r.source, r.value, r.raw) for r in step.rewards] == [("math.no_tool", 0.0, 1.0)]
    assert trajectory.variables["metrics"]["used_calculator"] == 0.0


def test_unparsable_answer_signal():
    env = make_arithmetic_env(split="test", air_weights=ALL_AIR)
    try:
        trajectory, _, _ = play(env, lambda obs, task: "Answer: I do not know", task_index=0)
    finally:
        env.close()
    assert rewards_by_source(trajectory) == [{"math.answer_unparsable": pytest.approx(-0.3)}]
    assert trajectory.variables["metrics"]["answer_parsed"] == 0.0


def test_run_tool_call_is_lenient_where_it_is_harmless():
    assert run_tool_call("calculator", '{"expression": "2+2"}')["result"] == "4"
    assert run_tool_call("calculator", '{"expr": "2+2"}')["result"] == "4"
    assert run_tool_call("calculator", "2+2")["result"] == "4"
    assert run_tool_call("calculator", {"expression": 5})["result"] == "5"
    assert run_tool_call("search", "{}")["error"] == "unknown_tool"
    assert run_tool_call("calculator", '{"a": "1", "b": "2"}')["error"] == "bad_arguments"
    assert run_tool_call("calculator", '{"expression": ["1"]}')["error"] == "bad_arguments"


def test_config_is_checked():
    with pytest.raises(ValueError, match="protocol"):
        MathAgentConfig(protocol="xml")
    with pytest.raises(ValueError, match="question"):
        MathAgentConfig(user_template="no placeholder")
    with pytest.raises(ValueError, match="split"):
        make_arithmetic_env(split="dev")


def _token_policy(tokenizer, replies):
    """Answers like the hf backend would: prompt ids from the chat template, the reply's tokens +
    EOS as the completion, tool calls parsed from the text."""
    from agentgym_lightning.policies.chat import decode_completion, render_prompt_ids

    replies = iter(replies)

    def policy(obs, task):
        prompt = render_prompt_ids(tokenizer, obs.request)
        ids = tokenizer(next(replies).format(**task), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        return decode_completion(tokenizer, prompt, ids, None, "stop", parse_tools=bool(obs.request.tools)).completion

    return policy


def test_prompts_extend_token_for_token_and_protocols_render_alike(smol_tokenizer):
    """Through the SmolLM2 chat template (no native tools): each call's prompt ids start with the
    previous call's prompt + completion ids, under both protocols, and both protocols show the
    model the very same tokens."""
    call = '<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}</tool_call>'
    prompts = {}
    for protocol in ("tools", "text"):
        trajectory = _token_episode(smol_tokenizer, call, protocol=protocol, tool_description="full")
        prompts[protocol] = [s.completion.prompt_token_ids for s in trajectory.steps]
    assert prompts["tools"] == prompts["text"]


def _token_episode(tokenizer, call: str, **env_kwargs: Any):
    """A calculator call (``call``, formatted with the task) then the answer, token-exact; checks
    that it solved the task and that the second prompt extended the first."""
    env = make_arithmetic_env(difficulty=2, split="test", **env_kwargs)
    try:
        trajectory, _, _ = play(env, _token_policy(tokenizer, [call, "Answer: {answer}"]), task_index=3)
    finally:
        env.close()
    assert trajectory.final_reward == 1.0
    assert [s.prompt_extends_previous for s in trajectory.steps] == [None, True]
    return trajectory


def test_text_protocol_extends_even_when_the_model_writes_its_own_json_layout(smol_tokenizer):
    """The text protocol echoes the reply verbatim, so a call written without the canonical
    spacing still leaves the next prompt a token-exact extension (the compact description is
    also shorter than the generic one)."""
    call = '<tool_call>{{"name":"calculator","arguments":{{"expression":"{expression}"}}}}</tool_call>'
    trajectory = _token_episode(smol_tokenizer, call, protocol="text")
    full = make_arithmetic_env(difficulty=2, split="test", protocol="text", tool_description="full")
    try:
        obs, _ = full.reset(options={"task_index": 3})
        assert len(trajectory.steps[0].completion.prompt_token_ids) < len(_token_policy(smol_tokenizer, [""])(obs, {}).prompt_token_ids) - 100
    finally:
        full.close()


@pytest.mark.parametrize(
    ("env_id", "kwargs"),
    [
        ("lightning/Arithmetic-v0", {}),
        ("lightning/Arithmetic-v0", {"split": "test", "difficulty": 4}),
        ("lightning/GSM8K-v0", {}),
        ("lightning/CalcX-v0", {}),
    ],
)
def test_check_env_passes_on_each_id(env_id, kwargs):
    with pytest.warns(MathDataWarning) if env_id != "lightning/Arithmetic-v0" else contextlib.nullcontext():
        env = gym.make(env_id, **kwargs)
    try:
        check_env(env.unwrapped)
    finally:
        env.close()


_ANNOTATION = re.compile(r"<<([^<>=]*)=([^<>]*)>>")


def _replay_solution_policy(obs, task):
    """Replays a GSM8K solution: one calculator call per ``<<expression=value>>`` annotation, one
    per turn, then ``Answer:`` with the last result."""
    steps = _ANNOTATION.findall(task["solution"])
    question = max(i for i, m in enumerate(obs.request.messages) if m["role"] == "user" and m["content"] == task["question"])
    done = sum(1 for m in obs.request.messages[question:] if m["role"] == "tool")
    if done < len(steps):
        call = ToolCall(id=new_tool_call_id(), name="calculator", arguments=json.dumps({"expression": steps[done][0]}))
        return Completion(text="", tool_calls=[call], finish_reason="tool_calls")
    return f"Answer: {obs.request.messages[-1]['content']}"


def test_gsm8k_multi_turn_episode_replaying_the_solution_with_the_calculator(gsm8k_dir: Path):
    """A real GSM8K item solved in five calls: four calculator calls (the solution's own
    annotations, tools protocol), each result read back from a tool message, then the answer."""
    env = gym.make("lightning/GSM8K-v0", data_dir=str(gsm8k_dir), limit=3, air_weights=ALL_AIR)
    try:
        assert len(env.unwrapped.tasks) == 3
        trajectory, observations, total = play(env.unwrapped, _replay_solution_policy, task_index=2)
    finally:
        env.close()
    task = trajectory.task
    assert task["id"] == "gsm8k-test-2" and task["answer"] == "70000" and "#### 70000" in task["solution"]
    annotations = _ANNOTATION.findall(task["solution"])
    assert len(annotations) == 4 and len(trajectory.steps) == 5
    assert trajectory.status is Status.SUCCEEDED and trajectory.final_reward == 1.0
    for step, (expression, value) in zip(trajectory.steps, annotations):
        assert step.outcome["calculator"] == [{"expression": expression, "result": value}]
    # one conversation: every prompt extends the last by the call and its tool result
    for before, after in zip(observations, observations[1:]):
        n = len(before.request.messages)
        assert after.request.messages[:n] == before.request.messages
        assert [m["role"] for m in after.request.messages[n:]] == ["assistant", "tool"]
    assert trajectory.result["calculator_calls"] == 4 and trajectory.variables["metrics"]["used_calculator"] == 1.0
    assert total == pytest.approx(1.0 + 4 * 0.1)


def test_calcx_option_answers_and_tolerance(calcx_file: Path):
    env = make_calcx_env(split="sample", data_dir=str(calcx_file))
    try:
        by_id = {t["id"]: i for i, t in enumerate(env.tasks)}
        option, _, _ = play(env, lambda obs, task: "The right choice is the third.\nAnswer: (C)", task_index=by_id["aqua_rat__0bgRP2fAiH8URR9A"])
        close, _, _ = play(env, lambda obs, task: "Answer: 0.6667", task_index=by_id["ape210k__00384263"])  # gold 2/3
    finally:
        env.close()
    assert option.final_reward == 1.0 and close.final_reward == 1.0


def test_unreadable_gold_is_an_infrastructure_failure():
    env = make_arithmetic_env(split="test")
    try:
        trajectory, _, _ = play(env, lambda obs, task: "Answer: 3", task={"question": "What is 1 + 2?", "answer": "n/a"})
    finally:
        env.close()
    assert trajectory.status is Status.INFRA_FAILED and trajectory.final_reward is None
    assert "gold answer 'n/a'" in trajectory.error


def test_math_reward_judges_plain_text():
    reward = MathReward()
    assert reward({"answer": "18"}, "$18") == 1.0
    assert reward({"answer": "18"}, {"answer": "17"}) == 0.0
    assert reward({"answer": "18"}, None) == 0.0


def test_gsm8k_sample_through_gym_make_announces_itself():
    with pytest.warns(MathDataWarning, match="bundled sample"):
        env = gym.make("lightning/GSM8K-v0", split="train")
    try:
        trajectory, _, total = play(env.unwrapped, calculator_policy, task_index=0)
    finally:
        env.close()
    assert total == 1.0 and trajectory.env_id == "lightning/GSM8K-v0"
    assert json.loads(json.dumps(trajectory.task)) == trajectory.task  # tasks stay JSON (trajectories are saved as JSONL)


def test_gsm8k_max_calc_steps_keeps_problems_with_few_calculations_and_shuffle_seed_orders_them(tmp_path: Path):
    """The recipe's subset rule: the gold solution's ``<<a*b=c>>`` annotations counted, the same
    rule for every split; then a fixed order drawn from ``shuffle_seed``, then ``offset`` and ``limit``."""
    from agentgym_lightning.envs.math.env import calculation_steps, make_gsm8k_env

    steps = [0, 1, 2, 3, 1, 2, 4, 2]
    lines = []
    for i, n in enumerate(steps):
        work = " ".join(f"<<{i}+{k}={i + k}>>{i + k}." for k in range(n))
        lines.append(json.dumps({"question": f"Problem {i}?", "answer": f"{work}\n#### {i}"}))
    (tmp_path / "test.jsonl").write_text("\n".join(lines) + "\n")

    def questions(**kwargs):
        env = make_gsm8k_env(split="test", data_dir=str(tmp_path), **kwargs)
        try:
            return [t["question"] for t in env.tasks]
        finally:
            env.close()

    assert calculation_steps("a <<1+2=3>>3 b <<3*2=6>>6") == 2
    assert questions() == [f"Problem {i}?" for i in range(len(steps))]
    kept = [f"Problem {i}?" for i, n in enumerate(steps) if n <= 2]
    assert questions(max_calc_steps=2) == kept
    assert questions(max_calc_steps=0) == ["Problem 0?"]
    shuffled = questions(max_calc_steps=2, shuffle_seed=0)
    assert sorted(shuffled) == sorted(kept) and shuffled != kept
    assert questions(max_calc_steps=2, shuffle_seed=0, limit=3) == shuffled[:3]
    # offset then limit: disjoint slices of the one shuffled order, together all of it
    first, rest = (questions(max_calc_steps=2, shuffle_seed=0, offset=o, limit=3) for o in (0, 3))
    assert first == shuffled[:3] and rest == shuffled[3:6] and first + rest == shuffled
    with pytest.raises(ValueError, match=r"offset must be 0 to 5 \(6 questions in test\), got 6"):
        questions(max_calc_steps=2, offset=6)
    with pytest.raises(ValueError, match="max_calc_steps must be an integer >= 0 or None"):
        questions(max_calc_steps=-1)
