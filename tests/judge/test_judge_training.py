"""The judge in a training run: its scores are the episodes' final rewards, costed per step, cached
in the run folder, and the policy itself can judge (served to the judge over HTTP)."""

from __future__ import annotations

import json

import pytest

from agentgym_lightning.testing.mock_openai_server import MockOpenAIServer, default_reply
from agentgym_lightning.trajectory import load_trajectories

pytest.importorskip("trl")


def config(tiny_model_dir, tmp_path, judge, **overrides):
    from agentgym_lightning.training import LightningRLConfig

    options = dict(
        env="lightning/GuessNumber-v0", env_kwargs={"max_guesses": 2}, model=str(tiny_model_dir), max_steps=1,
        tasks_per_step=2, num_generations=2, max_completion_length=4, output_dir=str(tmp_path), report_to=[],
        progress=False, judge=judge,
    )
    return LightningRLConfig(**{**options, **overrides})


def test_the_judges_scores_are_the_final_rewards_and_each_step_logs_its_cost(tiny_model_dir, tmp_path):
    from agentgym_lightning.policies.hf import HFPolicy
    from agentgym_lightning.training import LightningRLTrainer

    def second_is_best(body: dict) -> dict:
        return default_reply(body, json.dumps({"scores": [0.0, 1.0]}))

    with MockOpenAIServer(second_is_best) as server:
        cfg = config(tiny_model_dir, tmp_path, {"base_url": server.base_url, "model": "scripted"})
        policy = HFPolicy(str(tiny_model_dir), device="cpu", default_max_tokens=4)
        LightningRLTrainer(cfg, policy=policy).train()
        assert server.state.requests == 2  # one call per group
    episodes = list(load_trajectories(tmp_path / "trajectories" / "step-000001.jsonl"))
    assert len(episodes) == 4
    for group in {t.group_id for t in episodes}:
        members = sorted((t for t in episodes if t.group_id == group), key=lambda t: t.seed)
        assert [t.final_reward for t in members] == [0.0, 1.0]
        assert all(t.variables["judge"]["model"] == "scripted" for t in members)
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    step = next(m for m in metrics if m.get("step") == 1 and "judge/calls" in m)
    assert step["judge/calls"] == 2 and step["judge/groups"] == 2 and step["judge/groups_failed"] == 0
    assert step["train/reward/mean"] == 0.5
    assert len((tmp_path / "judge_cache.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize("max_staleness", [0, 1])
def test_the_policy_can_judge_itself(tiny_model_dir, tmp_path, max_staleness):
    """The tiny random model cannot write a scores object: its groups end infra_failed, counted,
    warned, and not trained on; the calls did reach the policy through its server (with
    max_staleness 1 too: the generator's own copy, judging the groups a step takes)."""
    from agentgym_lightning.judge import JudgeFailedWarning
    from agentgym_lightning.policies.hf import HFPolicy
    from agentgym_lightning.training import LightningRLTrainer

    cfg = config(tiny_model_dir, tmp_path, {"base_url": "policy", "max_attempts": 1, "max_tokens": 4}, max_staleness=max_staleness)
    policy = HFPolicy(str(tiny_model_dir), device="cpu", default_max_tokens=4)
    with pytest.warns(JudgeFailedWarning):
        LightningRLTrainer(cfg, policy=policy).train()
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    step = next(m for m in metrics if "judge/calls" in m)
    assert step["judge/calls"] == 2 and step["judge/groups_failed"] == 2 and step["judge/completion_tokens"] > 0
    episodes = list(load_trajectories(tmp_path / "trajectories" / "step-000001.jsonl"))
    assert all(t.status.value == "infra_failed" and t.error.startswith("judge failed") for t in episodes)


def test_judge_flags_build_the_config_and_a_rubric_file_is_read_into_it(tmp_path):
    import argparse

    from agentgym_lightning.commands import train as train_command

    rubric = tmp_path / "rubric.txt"
    rubric.write_text("Prefer the shortest correct answer.")
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    train_command.register(sub)
    args = parser.parse_args(
        ["train", "--judge-base-url", "http://127.0.0.1:1/v1", "--judge-model", "m", "--judge-weight", "0.5",
         "--judge-rubric", f"@{rubric}", "--output-dir", str(tmp_path / "run")]
    )
    cfg = train_command.build_config(args)
    assert cfg.judge == {"base_url": "http://127.0.0.1:1/v1", "model": "m", "weight": 0.5, "rubric": "Prefer the shortest correct answer."}
    with pytest.raises(ValueError, match="judge weight"):
        cfg.replace(judge={"base_url": "http://x/v1", "weight": 3})


def test_with_max_staleness_1_each_step_judges_the_groups_it_takes(tiny_model_dir, tmp_path):
    """Asynchronous training with a judge: the groups a step trains on are judged when the step
    takes them (once each: the cache and the call count say so), their judged rewards are what it
    trains on, and its calls are stamped within the bound."""
    from agentgym_lightning.policies.hf import HFPolicy
    from agentgym_lightning.training import LightningRLTrainer

    def second_is_best(body: dict) -> dict:
        return default_reply(body, json.dumps({"scores": [0.0, 1.0]}))

    with MockOpenAIServer(second_is_best) as server:
        cfg = config(tiny_model_dir, tmp_path, {"base_url": server.base_url, "model": "scripted"}, max_staleness=1, max_steps=2)
        policy = HFPolicy(str(tiny_model_dir), device="cpu", default_max_tokens=4, num_threads=1)
        result = LightningRLTrainer(cfg, policy=policy).train()
        policy.close()
        assert server.state.requests == 4  # one call per group trained on, 2 a step
    for step in (1, 2):
        episodes = list(load_trajectories(tmp_path / "trajectories" / f"step-{step:06d}.jsonl"))
        assert len(episodes) == 4
        for group in {t.group_id for t in episodes}:
            members = sorted((t for t in episodes if t.group_id == group), key=lambda t: t.seed)
            assert [t.final_reward for t in members] == [0.0, 1.0]
            assert all(t.variables["judge"]["model"] == "scripted" for t in members)
        assert all(0 <= step - 1 - s.policy_version <= 1 for t in episodes for s in t.steps)
        row = result.history[step - 1]
        assert row["judge/groups"] == 2 and row["judge/groups_failed"] == 0 and row["train/reward/mean"] == 0.5
    assert len((tmp_path / "judge_cache.jsonl").read_text().splitlines()) == 4
