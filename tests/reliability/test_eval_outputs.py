"""``eval`` and trajectory files under bad arguments, dead backends and hostile results."""

from __future__ import annotations

import json
import math
import os

import pytest

from agentgym_lightning import Completion, Status, Trajectory, load_trajectories
from agentgym_lightning.env import AgentEnv
from agentgym_lightning.metrics import summarize
from agentgym_lightning.rollouts.evaluation import evaluate
from agentgym_lightning.trajectory import TruncatedLineWarning


class CountingPolicy:
    """Answers "50", or fails every request when ``fail`` is set (a dead backend)."""

    fail = False

    def generate(self, requests):
        if self.fail:
            raise ConnectionError("connection refused")
        return [Completion(text="50") for _ in requests]

    def close(self):
        pass


@pytest.fixture
def dead_backend(monkeypatch):
    from agentgym_lightning import policies

    monkeypatch.setattr(CountingPolicy, "fail", True)
    monkeypatch.setattr(policies, "make_policy", lambda *a, **k: CountingPolicy())


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-turns", "0"], "--max-turns must be >= 1, got 0"),
        (["--env-kwarg", "no_such_option=1"], "no_such_option"),
        (["--env-kwarg", "time_limit=-1"], "time_limit must be > 0"),
        (["--backend", "openai", "--policy-kwarg", "no_such_option=1"], "has no option 'no_such_option'"),
        (["--output", "/proc/nope/out.jsonl"], "--output"),
        (["--output", "{tmp}"], "is a directory"),
        (["--output", "{tmp}/read-only/sub/out.jsonl"], "cannot be written"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2_before_any_model_is_built(argv, message, tmp_path, capsys, monkeypatch):
    from agentgym_lightning import cli, policies

    built = []
    monkeypatch.setattr(policies, "make_policy", lambda *a, **k: built.append(1) or CountingPolicy())
    (tmp_path / "read-only").mkdir(mode=0o500)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if "read-only" in " ".join(argv) and os.access(tmp_path / "read-only", os.W_OK):
        pytest.skip("running as a user who can write anywhere (root): no unwritable directory to test")
    code = cli.main(["eval", "--env", "lightning/GuessNumber-v0", "--episodes", "1", "--no-progress", *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and built == []
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_a_run_whose_episodes_all_fail_in_the_infrastructure_exits_1(dead_backend, capsys):
    from agentgym_lightning import cli

    code = cli.main(["eval", "--env", "lightning/GuessNumber-v0", "--episodes", "2", "--no-progress"])
    captured = capsys.readouterr()
    assert code == 1
    assert "all 2 episodes failed in the infrastructure" in captured.err and "connection refused" in captured.err
    assert "mean reward       n/a" in captured.out  # not "0.0000"


def agent_returning(value):
    def agent(task, ctx):
        ctx.chat_completion([{"role": "user", "content": "q"}])
        return value

    return agent


class Unprintable:
    def __repr__(self):
        raise RuntimeError("repr is broken")


def cyclic():
    d: dict = {}
    d["self"] = d
    return d


def test_an_unserializable_result_is_stored_as_a_safe_repr_and_the_run_goes_on(tmp_path):
    results = [{(1, 2): "tuple key"}, cyclic(), Unprintable(), float("nan"), {"ok": 1}]
    out = tmp_path / "o.jsonl"
    result = evaluate(
        lambda: AgentEnv(agent_returning(results.pop(0)) if results else agent_returning(None), [{}], lambda t, r: 1.0),
        lambda reqs: ["x"] * len(reqs),
        episodes=5,
        concurrency=1,
        output=str(out),
        progress=False,
        log_metrics=False,
    )
    assert len(result.trajectories) == 5
    lines = out.read_text().splitlines()
    assert len(lines) == 5
    for line in lines:  # strict JSON: no NaN/Infinity tokens anywhere
        json.loads(line, parse_constant=lambda token: pytest.fail(f"non-standard JSON token {token}"))
    assert len(list(load_trajectories(out))) == 5


def test_jsonl_is_strict_json_with_a_documented_mapping(tmp_path):
    t = Trajectory(episode_id="e", task={"x": math.nan, 1: math.inf}, result=[-math.inf, Unprintable(), 0.5])
    data = json.loads(t.to_json(), parse_constant=lambda token: pytest.fail(token))
    assert data["task"] == {"x": "NaN", "1": "Infinity"}
    assert data["result"] == ["-Infinity", "<unrepresentable Unprintable>", 0.5]


def test_the_loader_names_file_and_line_for_every_bad_line(tmp_path):
    good = Trajectory(episode_id="e").to_json()
    path = tmp_path / "t.jsonl"
    path.write_text(good + "\n" + json.dumps({"steps": "not a list"}) + "\n")
    with pytest.raises(ValueError, match=f"{path}:2: not a trajectory"):
        list(load_trajectories(path))
    path.write_text(good + "\n" + "[1, 2]\n")
    with pytest.raises(ValueError, match=f"{path}:2: not a trajectory"):
        list(load_trajectories(path))
    path.write_text(good + "\n" + good[:30])
    with pytest.warns(TruncatedLineWarning, match=f"{path}:2"):
        assert len(list(load_trajectories(path))) == 1


def test_unscored_episodes_are_reported_apart_not_as_zero():
    scored = Trajectory(episode_id="a", status=Status.SUCCEEDED, final_reward=1.0)
    unscored = Trajectory(episode_id="b", status=Status.SUCCEEDED, final_reward=None)
    m = summarize([scored, unscored], 1.0)
    assert m["reward/mean"] == 1.0 and m["success_rate"] == 1.0 and m["reward/unscored"] == 1.0


def test_eval_output_on_a_full_disk_prints_the_summary_one_error_line_and_exits_1(capsys, monkeypatch):
    from agentgym_lightning import cli, policies

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    monkeypatch.setattr(policies, "make_policy", lambda *a, **k: CountingPolicy())
    # Before: a 22-line OSError traceback and no summary.
    code = cli.main(["eval", "--env", "lightning/GuessNumber-v0", "--episodes", "2", "--no-progress", "--output", "/dev/full"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "mean reward" in out and "Traceback" not in err
    assert err.strip().splitlines() == ["agentgym-lightning eval: could not write /dev/full: No space left on device; "
                                        "the trajectories after it were not saved"]


def test_save_trajectories_with_swapped_arguments_says_so(tmp_path):
    from agentgym_lightning import save_trajectories

    t = Trajectory(episode_id="e", status=Status.SUCCEEDED)
    with pytest.raises(TypeError, match=r"save_trajectories\(path, trajectories\): path must be a file path, got list \(were the arguments swapped\?\)"):
        save_trajectories([t], tmp_path / "out.jsonl")
    assert save_trajectories(tmp_path / "out.jsonl", [t]) == 1
