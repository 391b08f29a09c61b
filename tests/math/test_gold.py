"""The math SFT warm start's gold episodes (``envs/math/gold.py``, issue 33): GSM8K train problems
played through the recipe's AutoGen agent with one calculator tool call per gold annotation and
the gold answer, written only when they score 1. The bundled sample's train split (no torch)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from agentgym_lightning import Status, Trajectory
from agentgym_lightning.envs.gold import GoldCounts, recipe_env_kwargs, write_solved_episodes
from agentgym_lightning.envs.math.gold import gold_calculations, gold_episodes, main
from agentgym_lightning.trajectory import load_trajectories

REPO = Path(__file__).resolve().parents[2]


def _recipe_kwargs_on_the_sample() -> dict:
    kwargs = recipe_env_kwargs(REPO / "recipes" / "math.yaml")
    assert kwargs["split"] == "train" and kwargs["agent"] == "autogen"
    del kwargs["data_dir"]  # the bundled sample (the conftest's cache has no imported copy)
    return kwargs


def test_the_gold_calculations_are_the_annotations_the_calculator_evaluates():
    solution = "She sold 48/2 = <<48/2=24>>24.\nThen 48+24 = <<48 + 24=72>>72.\nAnd <<twelve=12>>.\n#### 72"
    assert gold_calculations(solution) == ["48/2", "48 + 24"]  # 'twelve' is no expression the calculator takes
    assert gold_calculations("No calculation.\n#### 3") == []


def test_gold_episodes_call_the_calculator_for_each_annotation_answer_the_gold_and_score_1(tmp_path):
    pytest.importorskip("autogen_agentchat")
    output = tmp_path / "gold.jsonl"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the bundled sample announces itself
        counts = write_solved_episodes(output, gold_episodes(_recipe_kwargs_on_the_sample(), episodes=3, seed=1))
    assert counts == GoldCounts(written=3, skipped=0)
    episodes = list(load_trajectories(output))
    assert len(episodes) == 3 and len({t.task["question"] for t in episodes}) == 3
    for trajectory in episodes:
        calculations = gold_calculations(trajectory.task["solution"])
        assert 1 <= len(calculations) <= 2  # the recipe's max_calc_steps
        assert trajectory.final_reward == 1.0 and trajectory.status == Status.SUCCEEDED
        assert trajectory.variables["metrics"] == {"correct": 1.0, "used_calculator": 1.0, "answer_parsed": 1.0}
        calls = [call for step in trajectory.steps for call in step.completion.tool_calls]
        assert [c.name for c in calls] == ["calculator"] * len(calculations)
        assert [json.loads(c.arguments) for c in calls] == [{"expression": e} for e in calculations]
        assert [len(s.completion.tool_calls) for s in trajectory.steps] == [1] * len(calculations) + [0]  # one call a turn
        assert trajectory.steps[-1].completion.text == f"Answer: {trajectory.task['answer']}"


def test_only_train_problems_and_the_tools_protocol_are_played():
    with pytest.raises(ValueError, match="use split 'train'"):
        gold_episodes({"split": "test"}, 1)
    with pytest.raises(ValueError, match="use split 'train'"):
        gold_episodes({}, 1)  # GSM8K's default split is the held-out test
    with pytest.raises(ValueError, match="protocol 'tools'"):
        gold_episodes({"split": "train", "protocol": "text"}, 1)


def test_episodes_that_did_not_score_1_are_skipped_and_counted(tmp_path):
    episodes = [Trajectory(episode_id=f"e{i}", task={"q": i}, final_reward=reward) for i, reward in enumerate([1.0, 0.0, None, 1.0])]
    assert write_solved_episodes(tmp_path / "x.jsonl", episodes) == GoldCounts(written=2, skipped=2)
    assert [t.episode_id for t in load_trajectories(tmp_path / "x.jsonl")] == ["e0", "e3"]


def test_the_command_writes_the_episodes_and_refuses_the_held_out_split(tmp_path, capsys):
    pytest.importorskip("autogen_agentchat")
    output = tmp_path / "gold.jsonl"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["--env-kwarg", "split=train", "--env-kwarg", "agent=autogen", "--env-kwarg", "max_calc_steps=2",
                     "--episodes", "2", "--output", str(output)]) == 0
    assert "2 gold episodes scored 1 and were written; 0 did not" in capsys.readouterr().out
    assert len(list(load_trajectories(output))) == 2
    assert main(["--env-kwarg", "split=test", "--output", str(tmp_path / "x.jsonl")]) == 2
    assert "math gold: gold episodes are for training" in capsys.readouterr().err
