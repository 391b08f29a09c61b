"""--env verifiers:MODULE: a verifiers environment written with the classic API (a SingleTurnEnv, a
ToolEnv: tests/verifiers_env/environments/) runs its own rollout against the episode, every model
call a step; the episode's reward is the rubric's, each reward function's score recorded; its
dataset and eval dataset are the train and held-out splits; a module without load_environment and
a rollout that raises say so, the latter failing only its episode (infra_failed).

verifiers has a venv of its own (`make setup-verifiers`, `make test-verifiers`): no release of it
installs beside the autogen, mcp and openai-agents extras of .venv (pyproject.toml says why)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("verifiers") is None,
    reason="needs verifiers, which has a venv of its own: make test-verifiers (pyproject.toml's verifiers extra says why)",
)

ENVIRONMENTS = Path(__file__).with_name("environments")


@pytest.fixture(autouse=True)
def environments_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(ENVIRONMENTS))


def make(env: str, **kwargs):
    from agentgym_lightning.registration import make_env_factory, resolve_env_id

    return make_env_factory(resolve_env_id(env), kwargs)()


def run(env, actions, task_index=0):
    """One episode answered by ``actions`` in turn; (observations, last info)."""
    obs, _ = env.reset(seed=0, options={"task_index": task_index})
    seen = [obs]
    for action in actions:
        obs, _, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return seen, info
        seen.append(obs)
    raise AssertionError(f"the episode did not end after {len(actions)} answers")


def test_a_single_turn_env_is_an_episode_whose_reward_is_the_rubrics():
    env = make("verifiers:vf_sums")
    try:
        seen, right = run(env, ["1"])
        _, wrong = run(env, ["The answer is surely 2"])
    finally:
        env.close()
    messages = seen[0].request.messages
    assert messages[0] == {"role": "system", "content": "Answer with the number only."}
    assert messages[-1]["content"] == "What is 0 + 1?"
    trajectory = right["trajectory"]
    assert trajectory.env_id == "verifiers:vf_sums" and len(trajectory.steps) == 1
    # Its rubric: exact_answer (weight 1) and brief (weight 0.25).
    assert right["status"] == "succeeded" and right["final_reward"] == pytest.approx(1.25)
    # Each reward function's score, and the metric verifiers' MultiTurnEnv adds itself (weight 0).
    assert trajectory.variables["metrics"] == {"exact_answer": 1.0, "brief": 1.0, "num_turns": 1.0}
    assert trajectory.variables["rubric"]["brief"] == {"score": 1.0, "weight": 0.25}
    assert trajectory.variables["rubric"]["num_turns"] == {"score": 1.0, "weight": 0.0}
    assert wrong["final_reward"] == 0.0
    assert wrong["trajectory"].variables["metrics"] == {"exact_answer": 0.0, "brief": 0.0, "num_turns": 1.0}


def test_a_tool_env_runs_its_tools_between_the_models_calls():
    from agentgym_lightning.llm import Completion, ToolCall

    env = make("verifiers:vf_calculator")
    try:
        seen, info = run(env, [Completion(tool_calls=[ToolCall(id="m1", name="multiply", arguments={"a": 3, "b": 7})]), "21"])
    finally:
        env.close()
    assert [t["function"]["name"] for t in seen[0].request.tools] == ["multiply"]
    tool_message = seen[1].request.messages[-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "m1" and tool_message["content"] == "21"
    assert info["status"] == "succeeded" and info["final_reward"] == 1.0 and len(info["trajectory"].steps) == 2
    metrics = info["trajectory"].variables["metrics"]
    assert metrics["correct"] == 1.0 and metrics["total_tool_calls"] == 1.0 and metrics["multiply_calls"] == 1.0


def test_the_eval_split_is_the_eval_dataset_and_kwargs_reach_load_environment():
    env = make("verifiers:vf_sums", split="eval", num_eval=3, time_limit=60)
    try:
        assert [t["answer"] for t in env.tasks] == ["201", "203", "205"] and env.time_limit == 60
    finally:
        env.close()
    train, again = make("verifiers:vf_sums", num_train=2), make("verifiers:vf_sums", num_train=2)
    try:
        assert [t["answer"] for t in train.tasks] == ["1", "3"]
        # One env per concurrent episode, one Environment loaded for them all (as verifiers shares one).
        assert train.agent.environment is again.agent.environment is not env.agent.environment
    finally:
        train.close()
        again.close()


def test_a_module_without_load_environment_says_what_one_is(capsys):
    from agentgym_lightning import cli
    from agentgym_lightning.envs.verifiers_env.errors import VerifiersLoadError

    with pytest.raises(VerifiersLoadError, match=r"verifiers:vf_no_loader: vf_no_loader has no load_environment; a verifiers environment"):
        make("verifiers:vf_no_loader")
    with pytest.raises(VerifiersLoadError, match="cannot import 'vf_nowhere'"):
        make("verifiers:vf_nowhere")
    assert cli.main(["eval", "--env", "verifiers:vf_no_loader", "--episodes", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "has no load_environment" in err and len(err.strip().splitlines()) == 1


def test_a_rollout_that_raises_fails_only_its_episode_infra_failed():
    env = make("verifiers:vf_broken")
    try:
        _, info = run(env, ["my move"])
        assert info["status"] == "infra_failed" and info["final_reward"] is None
        assert "verifiers:vf_broken: its rollout raised KeyError: 'board'" in info["error"]
        _, again = run(env, ["another move"])  # the env goes on: the failure was that episode's
        assert again["status"] == "infra_failed" and len(again["trajectory"].steps) == 1
    finally:
        env.close()


def test_train_one_step_on_a_verifiers_environment_from_the_cli(train_one_step, tmp_path):
    episodes = train_one_step("verifiers:vf_sums", "--env-kwarg", "num_train=3", "--set", "max_completion_length=16", cwd=ENVIRONMENTS)
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = next(m for m in metrics if m.get("step") == 1 and any(k.endswith("metrics/exact_answer") for k in m))
    assert any(k.endswith("metrics/brief") for k in step)  # each rubric function, in the run's metrics
    assert len(episodes) == 4
    for episode in episodes:
        assert episode["env_id"] == "verifiers:vf_sums" and episode["status"] == "succeeded", episode["error"]
        rubric = episode["variables"]["rubric"]
        assert episode["final_reward"] == pytest.approx(sum(r["score"] * r["weight"] for r in rubric.values()))
        [call] = episode["steps"]  # a SingleTurnEnv: one model call, recorded with its token ids
        assert call["completion"]["prompt_token_ids"] and call["completion"]["completion_token_ids"]
        assert call["request"]["messages"][-1]["content"] == episode["task"]["prompt"][-1]["content"]
