"""``lightning/Spider-v0`` through the env: gold answers, rewards, AIR, roles and turns."""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import agentgym_lightning  # noqa: F401 - registers lightning/Spider-v0
from agentgym_lightning import Status
from agentgym_lightning.envs.spider.data import SpiderDataWarning
from agentgym_lightning.envs.spider.env import SpiderReward, gold_policy, make_env
from agentgym_lightning.envs.spider.evaluation import SpiderEvaluator


def run_episode(env, policy, **reset_options: Any):
    """Play one episode; ``policy(obs, task) -> completion``. Returns (trajectory, return)."""
    obs, info = env.reset(options=reset_options)
    task = info["task"]
    total, done = 0.0, False
    while not done:
        obs, reward, terminated, truncated, info = env.step(policy(obs, task))
        total += reward
        done = terminated or truncated
    return info["trajectory"], total


@pytest.mark.spider
def test_every_usable_dev_gold_scores_one_through_the_env(spider_dir: Path, tree_hash):
    """All 972 usable dev questions, answered with their gold SQL by a scripted policy."""
    before = tree_hash(spider_dir / "database")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SpiderDataWarning)
        env = make_env(split="dev", data_dir=str(spider_dir))
    env.spider_evaluator  # noqa: B018 - the env exposes its evaluator
    n = len(env.tasks)
    assert n == 972
    failures = []
    start = time.monotonic()
    try:
        for i in range(n):
            trajectory, total = run_episode(env, gold_policy, task_index=i)
            metrics = trajectory.variables.get("metrics")
            if trajectory.status is not Status.SUCCEEDED or metrics != {"strict": 1.0, "official": 1.0} or total != 1.0:
                failures.append((trajectory.task["id"], trajectory.status, trajectory.error, metrics))
    finally:
        env.close()
    elapsed = time.monotonic() - start
    assert not failures, failures[:5]
    print(f"\n{n} gold episodes through the env in {elapsed:.1f} s ({n / elapsed:.0f} episodes/s)")
    assert tree_hash(spider_dir / "database") == before


def test_registered_id_runs_on_the_sample(isolated_cache: Path):
    with pytest.warns(SpiderDataWarning, match="bundled 44-question sample"):
        env = gym.make("lightning/Spider-v0")
    try:
        trajectory, total = run_episode(env.unwrapped, gold_policy, task_index=0)
        assert total == 1.0 and trajectory.env_id == "lightning/Spider-v0"
        assert str(isolated_cache) in trajectory.task["db_path"]  # built into the cache, not the repo
    finally:
        env.close()


@pytest.fixture
def sample_env(sample_dir: Path):
    envs = []

    def build(**kwargs: Any):
        env = make_env(data_dir=str(sample_dir), **kwargs)
        envs.append(env)
        return env

    yield build
    for env in envs:
        env.close()


def test_first_observation_is_the_writer_call(sample_env):
    env = sample_env()
    obs, info = env.reset(options={"task_index": 0})
    assert info["task"]["question"] == "How many books are there?"
    system, user = obs.request.messages
    assert "CREATE TABLE book" in system["content"] and "example rows" in system["content"]
    assert "How many books are there?" in user["content"]
    assert obs.request.metadata == {"role": "writer", "trainable": "true"}
    env.step("```sql\nSELECT count(*) FROM book\n```")
    env.step("VERDICT: CORRECT")


def test_roles_trainable_flags_and_the_rewrite_loop(sample_env):
    env = sample_env(max_turns=3)

    def stubborn_checker(obs, task):
        role = obs.request.metadata["role"]
        if role == "checker":
            return "The count should exclude nothing... VERDICT: INCORRECT"
        if role == "writer":
            return "```sql\nSELECT count(*) FROM author\n```"  # wrong table
        return f"```sql\n{task['query']}\n```"

    trajectory, total = run_episode(env, stubborn_checker, task_index=0)
    assert [s.role for s in trajectory.steps] == ["writer", "checker", "rewriter", "checker", "rewriter"]
    assert [s.trainable for s in trajectory.steps] == [True, False, True, False, True]
    assert trajectory.result["sql"] == "SELECT count(*) FROM book"  # the last rewrite
    assert total == 1.0
    assert trajectory.steps[1].outcome["check"] == "incorrect"


def test_max_turns_one_is_a_single_call(sample_env):
    env = sample_env(max_turns=1)
    trajectory, total = run_episode(env, gold_policy, task_index=0)
    assert len(trajectory.steps) == 1 and total == 1.0


def test_failed_execution_goes_straight_to_the_rewriter(sample_env):
    env = sample_env(max_turns=2)
    answers = iter(["```sql\nSELECT nope FROM book\n```", "```sql\nSELECT count(*) FROM book\n```"])
    trajectory, total = run_episode(env, lambda obs, task: next(answers), task_index=0)
    assert [s.role for s in trajectory.steps] == ["writer", "rewriter"]
    assert "no such column" in trajectory.steps[1].request.messages[-1]["content"]
    assert total == 1.0


def test_reward_variants(sample_env):
    # "How many books are there?" (9): a constant answer scores in `official` only.
    official = sample_env(reward="official", max_turns=1)
    trajectory, total = run_episode(official, lambda obs, task: "SELECT 9", task_index=0)
    assert total == 1.0 and trajectory.variables["metrics"] == {"strict": 0.0, "official": 1.0}
    strict = sample_env(max_turns=1)
    trajectory, total = run_episode(strict, lambda obs, task: "SELECT 9", task_index=0)
    assert total == 0.0 and trajectory.result["reasons"]["strict"] == "reads_no_table"
    with pytest.raises(ValueError, match="unknown Spider reward"):
        make_env(reward="lenient")


@pytest.mark.parametrize(
    ("completion", "status"),
    [
        ("I am not sure.", "no_sql"),
        ("```sql\nSELEC name FRM book WHERE\n```", "parse_error"),
        ("```sql\nSELECT nope FROM book\n```", "exec_error"),
        ("```sql\nSELECT count(*) FROM book\n```", "executes"),
    ],
)
def test_air_components(sample_env, completion, status):
    weights = {"spider.no_sql": -0.5, "spider.parse_error": -0.3, "spider.exec_error": -0.1, "spider.executes": 0.2}
    env = sample_env(max_turns=1, air_weights=weights)
    trajectory, total = run_episode(env, lambda obs, task: completion, task_index=0)
    step = trajectory.steps[0]
    assert step.outcome["sql_status"] == status
    assert [(r.source, r.value, r.raw) for r in step.rewards] == [(f"spider.{status}", weights[f"spider.{status}"], 1.0)]
    assert total == pytest.approx(weights[f"spider.{status}"] + trajectory.final_reward)
    # Off by default: no weights, no AIR components.
    plain = sample_env(max_turns=1)
    trajectory, _ = run_episode(plain, lambda obs, task: completion, task_index=0)
    assert trajectory.steps[0].rewards == []


def test_failing_gold_is_an_infrastructure_failure(sample_env):
    env = sample_env(max_turns=1)
    task = dict(env.tasks[0], id="broken", query="SELECT nope FROM nowhere")
    obs, _ = env.reset(options={"task": task})
    _, _, terminated, truncated, info = env.step("SELECT 1")
    assert truncated and not terminated
    assert info["status"] == "infra_failed" and "gold query failed" in info["error"]
    assert not info["trajectory"].trainable


def test_reward_fn_judges_plain_sql(sample_dir: Path):
    task = make_env(data_dir=str(sample_dir)).tasks[0]
    reward = SpiderReward(SpiderEvaluator(), "strict")
    assert reward(task, "SELECT count(*) FROM book") == 1.0
    assert reward(task, "SELECT 9") == 0.0
    assert reward(task, None) == 0.0
    assert SpiderReward(SpiderEvaluator(), "official")(task, "SELECT 9") == 1.0


def test_a_bombed_query_runs_once_per_step(sample_env, monkeypatch):
    """The agent's run of its final query is the judged one: a query that exhausts its time
    limit costs it once, not once for the agent plus once per reward variant."""
    env = sample_env(max_turns=1, sql_timeout_s=0.3)
    sandbox = env.spider_evaluator.sandbox
    real_run = sandbox.run
    runs: list[str] = []
    monkeypatch.setattr(sandbox, "run", lambda db, sql, **kw: runs.append(sql) or real_run(db, sql, **kw))
    # Never ends; DISTINCT makes the official normalization a different text (it drops DISTINCT).
    bomb = "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT DISTINCT count(*) FROM r"
    trajectory, total = run_episode(env, lambda obs, task: f"```sql\n{bomb}\n```", task_index=0)
    assert total == 0.0 and trajectory.status is Status.SUCCEEDED
    assert len([sql for sql in runs if "RECURSIVE" in sql.upper()]) == 1
    assert trajectory.result["reasons"] == {"strict": "pred_timeout", "official": "pred_timeout"}
    assert trajectory.result["prediction"]["error"] == "timeout"


def test_the_result_records_what_a_mismatch_needs(sample_env):
    """Shape and first rows of the final prediction, the gold shape and each verdict: enough to
    see why an answer was wrong from the JSONL alone."""
    import json

    env = sample_env(max_turns=1)
    trajectory, total = run_episode(env, lambda obs, task: "```sql\nSELECT title FROM book\n```", task_index=0)
    result = trajectory.result
    assert total == 0.0 and result["reasons"] == {"strict": "mismatch", "official": "mismatch"}
    prediction = result["prediction"]
    assert prediction["shape"] == [9, 1] and prediction["columns"] == ["title"]
    assert len(prediction["rows"]) == 5 and all(isinstance(row[0], str) for row in prediction["rows"])
    assert result["gold"] == {"shape": [1, 1]}
    assert result["verdicts"]["strict"] == {
        "score": 0.0, "reason": "mismatch", "detail": "", "pred_shape": [9, 1], "gold_shape": [1, 1]
    }
    assert json.loads(trajectory.to_json())["result"] == result  # all of it is plain JSON


def test_sql_limits_reach_the_sandbox(sample_env):
    env = sample_env(max_turns=1, sql_limits={"max_result_bytes": 300})
    trajectory, total = run_episode(env, lambda obs, task: "```sql\nSELECT * FROM book\n```", task_index=0)
    assert total == 0.0 and trajectory.result["reasons"]["strict"] == "pred_too_large"
    with pytest.raises(ValueError, match="unknown field"):
        make_env(sql_limits={"max_result_megabytes": 1})


def test_offset_and_limit_pick_a_slice_of_the_split(sample_env):
    ids = [t["id"] for t in sample_env().tasks]
    assert [t["id"] for t in sample_env(limit=3).tasks] == ids[:3]
    assert [t["id"] for t in sample_env(offset=2, limit=3).tasks] == ids[2:5]
    assert [t["id"] for t in sample_env(offset=len(ids) - 1).tasks] == ids[-1:]
    with pytest.raises(ValueError, match=rf"offset must be 0 to {len(ids) - 1} \({len(ids)} questions in dev\), got {len(ids)}"):
        sample_env(offset=len(ids))
    with pytest.raises(ValueError, match="limit must be at least 1, got 0"):
        sample_env(limit=0)


@pytest.mark.spider
def test_eval_announces_the_skipped_dev_questions_once(spider_dir: Path, monkeypatch, capsys):
    """62 dev questions need the missing wta_1 database: said once, with count and reason, even
    though eval builds an env to check its arguments and then one per concurrent episode."""
    from agentgym_lightning import cli, policies

    class SelectOne:
        def generate(self, requests):
            return ["```sql\nSELECT 1\n```"] * len(requests)

        def close(self):
            pass

    monkeypatch.setattr(policies, "make_policy", lambda *a, **k: SelectOne())
    monkeypatch.setenv("AGENTGYM_LIGHTNING_SPIDER_DIR", str(spider_dir))
    from agentgym_lightning.envs.spider import data

    monkeypatch.setattr(data, "_cache", {})  # a fresh process: nothing loaded yet
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = cli.main(["eval", "--env", "lightning/Spider-v0", "--episodes", "3", "--concurrency", "3", "--no-progress",
                         "--env-kwarg", "max_turns=1"])
    assert code == 0
    skipped = [w for w in caught if issubclass(w.category, SpiderDataWarning)]
    assert len(skipped) == 1 and "skipped 62 of 1034" in str(skipped[0].message) and "missing" in str(skipped[0].message)
