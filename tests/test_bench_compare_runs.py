"""bench/compare_runs.py: two run folders compared call for call (issue 48's no-behaviour-change check)."""

from __future__ import annotations

import json
import runpy
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]
compare_runs = SimpleNamespace(**runpy.run_path(str(REPO / "bench" / "compare_runs.py")))


def _episode(task: str, seed: int, completion: list[int], logprobs: list[float], reward: float) -> dict:
    call = {"prompt_token_ids": [1, 2, 3], "completion_token_ids": completion, "logprobs": logprobs}
    return {"task": {"id": task}, "seed": seed, "steps": [{"completion": call}], "final_reward": reward}


def _run(folder: Path, episodes: list[dict], train_reward: float) -> Path:
    (folder / "trajectories").mkdir(parents=True)
    # Written in completion order: the comparison must match by task and seed, not by line.
    (folder / "trajectories" / "step-000001.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/reward/mean": train_reward}) + "\n")
    return folder


def test_runs_that_differ_only_in_order_and_logprob_bits_are_the_same(tmp_path, capsys):
    a = _run(tmp_path / "a", [_episode("t1", 0, [5, 6], [-0.5, -0.25], 1.0), _episode("t2", 1, [7], [-1.0], 0.0)], 0.5)
    b = _run(tmp_path / "b", [_episode("t2", 1, [7], [-1.0 + 1e-6], 0.0), _episode("t1", 0, [5, 6], [-0.5, -0.25], 1.0)], 0.5)
    assert compare_runs.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "2 episodes matched (0 unmatched), tokens equal in 2, final reward equal in 2" in out
    assert out.rstrip().endswith("SAME")


@pytest.mark.parametrize(
    "changed, train_reward, tol",
    [
        (_episode("t1", 0, [5, 9], [-0.5, -0.25], 1.0), 0.5, 1e-3),  # a token
        (_episode("t1", 0, [5, 6], [-0.5, -0.25], 0.0), 0.5, 1e-3),  # a reward
        (_episode("t1", 0, [5, 6], [-0.5, -0.20], 1.0), 0.5, 1e-3),  # a log-prob beyond the tolerance
        (_episode("t1", 0, [5, 6], [-0.5, -0.25], 1.0), 0.25, 1e-3),  # a step's train reward
        (_episode("t1", 1, [5, 6], [-0.5, -0.25], 1.0), 0.5, 1e-3),  # an episode only one run has
    ],
)
def test_any_difference_is_reported(tmp_path, changed, train_reward, tol, capsys):
    a = _run(tmp_path / "a", [_episode("t1", 0, [5, 6], [-0.5, -0.25], 1.0)], 0.5)
    b = _run(tmp_path / "b", [changed], train_reward)
    assert compare_runs.main([str(a), str(b), "--logprob-tol", str(tol)]) == 1
    assert capsys.readouterr().out.rstrip().endswith("DIFFERENT")


def test_a_folder_that_is_not_a_run_is_named(tmp_path):
    with pytest.raises(SystemExit):
        compare_runs.main([str(tmp_path), str(tmp_path)])
