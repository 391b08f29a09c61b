"""Held-out evaluations compared task by task (`agentgym-lightning compare`): counts against a hand count."""

from __future__ import annotations

import json
import math

import pytest

from agentgym_lightning.cli import main
from agentgym_lightning.llm import ChatRequest, Completion
from agentgym_lightning.training.paired_comparison import compare_paired, pool, sign_test_p
from agentgym_lightning.trajectory import Status, Step, Trajectory, save_trajectories


def _episode(task_id: str, solved: bool, status: Status = Status.SUCCEEDED, n: int = 0) -> Trajectory:
    step = Step(index=0, request=ChatRequest(messages=[{"role": "user", "content": "q"}]), completion=Completion(text="a"))
    return Trajectory(episode_id=f"{task_id}-{solved}-{n}", task={"id": task_id}, steps=[step], status=status,
                      final_reward=1.0 if solved else 0.0, group_id=task_id, seed=n)


def _evaluation(solved: dict[str, bool]) -> list[Trajectory]:
    return [_episode(task, ok) for task, ok in solved.items()]


# Base solves a, b; the model solves b, c, d: won c and d, lost a; b (both) and e (neither) tie.
BASE = {"a": True, "b": True, "c": False, "d": False, "e": False}
MODEL = {"a": False, "b": True, "c": True, "d": True, "e": False}


def test_won_and_lost_are_the_tasks_one_side_solved_and_ties_count_for_neither():
    c = compare_paired(_evaluation(BASE), _evaluation(MODEL))
    assert (c.tasks, c.base_solved, c.model_solved, c.won, c.lost) == (5, 2, 3, 2, 1)
    # P(X >= 2), X ~ Bin(3, 1/2) = (3 + 1) / 8; the two-sided doubles the smaller tail.
    assert c.p_better == pytest.approx(0.5)
    assert c.p_different == pytest.approx(1.0)


def test_the_sign_test_is_the_exact_binomial_tail():
    assert sign_test_p(8, 3) == pytest.approx(232 / 2048)  # 11 changed tasks, 8 won: C(11,8..11) / 2^11
    assert sign_test_p(4, 1) == pytest.approx(6 / 32)
    assert sign_test_p(0, 0) == 1.0
    assert sign_test_p(5, 0) == pytest.approx(1 / 32)
    assert sign_test_p(0, 5) == 1.0
    with pytest.raises(ValueError, match="counts"):
        sign_test_p(-1, 2)


def test_a_task_sampled_several_times_is_compared_by_its_share_and_infra_failures_are_not_attempts():
    base = [_episode("a", True, n=0), _episode("a", False, n=1), _episode("b", False, n=0), _episode("b", False, n=1)]
    model = [_episode("a", True, n=0), _episode("a", True, n=1),  # a: 1/2 -> 2/2, won
             _episode("b", False, n=0), _episode("b", True, status=Status.INFRA_FAILED, n=1)]  # b: 0/2 -> 0/1, tie
    c = compare_paired(base, model)
    assert (c.tasks, c.won, c.lost) == (2, 1, 0)
    assert (c.base_solved, c.model_solved) == (0.5, 1.0)


def test_tasks_in_one_evaluation_only_are_counted_apart_and_no_shared_task_is_an_error():
    c = compare_paired(_evaluation({"a": True, "b": False}), _evaluation({"b": True, "z": True}))
    assert (c.tasks, c.won, c.lost, c.only_base, c.only_model) == (1, 1, 0, 1, 1)
    with pytest.raises(ValueError, match="share no task"):
        compare_paired(_evaluation({"a": True}), _evaluation({"z": True}))


def test_pooling_adds_each_pairs_counts():
    one = compare_paired(_evaluation(BASE), _evaluation(MODEL))
    two = compare_paired(_evaluation(MODEL), _evaluation(BASE))  # the other way: won 1, lost 2
    both = pool([one, two])
    assert (both.tasks, both.won, both.lost, both.base_solved, both.model_solved) == (10, 3, 3, 5, 5)
    assert both.p_better == pytest.approx(sign_test_p(3, 3))
    with pytest.raises(ValueError, match="nothing to pool"):
        pool([])


def test_the_command_prints_each_pair_and_the_pooled_line(tmp_path, capsys):
    paths = {}
    for name, solved in {"base0": BASE, "model0": MODEL, "base1": BASE, "model1": BASE}.items():
        paths[name] = str(tmp_path / f"{name}.jsonl")
        save_trajectories(paths[name], _evaluation(solved))
    assert main(["compare", "--json", "--pairs", paths["base0"], paths["model0"], paths["base1"], paths["model1"]]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["won"], r["lost"], r["tasks"]) for r in rows] == [(2, 1, 5), (0, 0, 5), (2, 1, 10)]
    assert rows[-1]["name"] == "pooled (2 pairs)" and math.isclose(rows[-1]["p_better"], 0.5)
    assert main(["compare", paths["base0"], paths["model0"], paths["base0"]]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("won 2, lost 1; sign test p = 0.5 (one-sided: the model better; two-sided 1)")
    assert "2 -> 2 of 5 (+0); won 0, lost 0" in out[1]


@pytest.mark.parametrize("args, message", [
    (["only.jsonl"], "give a base and at least one model"),
    (["--pairs", "a.jsonl", "b.jsonl", "c.jsonl"], "BASE MODEL pairs"),
    (["missing.jsonl", "also.jsonl"], "no such evaluation file"),
])
def test_the_command_refuses_what_it_cannot_compare_saying_why(args, message, capsys):
    assert main(["compare", *args]) == 2
    assert message in capsys.readouterr().err


def test_a_run_folder_is_refused_with_where_its_evaluations_are(tmp_path, capsys):
    save_trajectories(tmp_path / "base.jsonl", _evaluation(BASE))
    assert main(["compare", str(tmp_path / "base.jsonl"), str(tmp_path)]) == 2
    assert "eval/step-N.jsonl" in capsys.readouterr().err
