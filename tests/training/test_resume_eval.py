"""A run killed during a held-out evaluation that ``eval_steps`` made due runs it again when
resumed: the checkpoint of that step is written before the evaluation, so without this the
resumed run would skip that point of the held-out curve."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("trl") is None, reason="needs the train extra (make setup)"
)

REPO = Path(__file__).resolve().parents[2]


def _train(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "agentgym_lightning", "train", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _evals_at(run: Path) -> list[int]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [int(x["step"]) for x in lines if "eval/reward/mean" in x]


def test_an_unfinished_due_evaluation_runs_again_on_resume_and_a_finished_one_does_not(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    _train("--env", "lightning/GuessNumber-v0", "--model", str(tiny_model_dir), "--steps", "2", "--tasks-per-step", "1",
           "--group-size", "2", "--env-kwarg", "max_guesses=2", "--eval-env-kwarg", "max_guesses=2", "--eval-steps", "2",
           "--eval-episodes", "2", "--set", "max_completion_length=4", "--set", "save_total_limit=null", "--save-steps", "1",
           "--no-wandb", "--no-progress", "--output-dir", str(run), cwd=tmp_path)
    assert _evals_at(run) == [0, 2]
    # Killed during step 2's evaluation: one of its two episodes written.
    written = run / "eval" / "step-000002.jsonl"
    written.write_text(written.read_text().splitlines()[0] + "\n")
    step_2 = run / "checkpoints" / "checkpoint-000002"
    _train("--resume", str(step_2), "--steps", "4", "--no-progress", cwd=tmp_path)
    assert _evals_at(run) == [0, 2, 2, 4]  # step 2 again, then every 2 steps and at the end
    assert len(written.read_text().splitlines()) == 2
    # Resumed again from step 2, whose evaluation is now complete: not run a third time (a resume
    # cuts metrics.jsonl back to its step, so step 4's line goes and step 3's final eval follows).
    _train("--resume", str(step_2), "--steps", "3", "--no-progress", cwd=tmp_path)
    assert _evals_at(run) == [0, 2, 2, 3]
    # A step no evaluation was due at: nothing extra either.
    _train("--resume", str(run / "checkpoints" / "checkpoint-000003"), "--steps", "4", "--no-progress", cwd=tmp_path)
    assert _evals_at(run) == [0, 2, 2, 3, 4]
