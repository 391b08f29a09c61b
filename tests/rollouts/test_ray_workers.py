"""Rollouts on Ray workers (local Ray, 2 workers): the same trajectories as in one process, and
the documented counts when a worker dies or hangs. One Ray for the module (``local_ray``,
tests/conftest.py); it is shut down and leaves no process behind."""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
import time
import uuid

import pytest

ray = pytest.importorskip("ray", reason="needs the ray extra (pip install 'agentgym-lightning[ray]')")
import cloudpickle  # noqa: E402 - installed with ray

from agentgym_lightning.env import AgentEnv  # noqa: E402
from agentgym_lightning.llm import Completion  # noqa: E402
from agentgym_lightning.rollouts.ray_workers import RayRolloutRunner  # noqa: E402
from agentgym_lightning.rollouts.in_process import rollout  # noqa: E402
from agentgym_lightning.trajectory import Status  # noqa: E402

# The workers unpickle this module's agent, env and policy by value (a test module is not
# importable by name in the actors).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def agent(task, ctx):
    answer = None
    for i in range(task["calls"]):
        answer = ctx.chat_completion([{"role": "user", "content": f"{task['id']}:{i}"}])
    while task.get("hold") and os.path.exists(task["hold"]) and not ctx.cancelled.is_set():
        time.sleep(0.02)  # held until the test removes the marker
    return answer.text


def make_env(tasks=None):
    tasks = tasks or [{"id": i, "calls": 2} for i in range(6)]
    return AgentEnv(agent, tasks, reward_fn=lambda task, result: float(len(result) % 3), seed_calls=True)


class Scripted:
    """Deterministic, and depends on each call's seed (so seeds must match across paths)."""

    def generate(self, requests):
        return [
            Completion(
                text=f"{r.messages[-1]['content']}/{r.sampling.seed}",
                prompt_token_ids=[len(r.messages), r.sampling.seed % 1000],
                completion_token_ids=[r.sampling.seed % 997],
                logprobs=[-0.5],
            )
            for r in requests
        ]


def _content(trajectories):
    """Trajectories in plan order, compared on content (group ids are drawn per plan)."""
    out = sorted(trajectories, key=lambda t: t.seed)
    groups = {}
    for t in out:
        t.group_id = groups.setdefault(t.group_id, len(groups))
    return out


def test_two_workers_give_the_same_trajectories_as_one_process(local_ray):
    with RayRolloutRunner(make_env, Scripted, num_workers=2) as runner:
        remote = runner.rollout(episodes=12, group_size=2, concurrency=4, seed=5)
        assert sorted(runner.stats.per_worker.values()) == [6, 6]  # 3 groups each
    local = rollout(make_env, Scripted(), episodes=12, group_size=2, concurrency=4, seed=5, progress=False)
    assert len(remote) == 12 and all(t.status is Status.SUCCEEDED for t in remote)
    assert _content(remote) == _content(local)
    assert remote[0].steps[0].completion.completion_token_ids is not None


@pytest.mark.parametrize("retry", [False, True])
def test_a_killed_worker_loses_only_its_episodes(local_ray, tmp_path, retry):
    marker = tmp_path / "hold"
    marker.touch()
    held = {"id": 0, "calls": 1, "hold": str(marker)}
    # Groups are dealt round-robin: worker 0 gets the held groups, worker 1 the free ones.
    tasks = [held, {"id": 1, "calls": 1}, held, {"id": 3, "calls": 1}]
    with RayRolloutRunner(make_env, Scripted, num_workers=2, retry_infra_failed=retry) as runner:
        pids = runner.worker_pids()
        got = []
        for trajectory in runner.iter_rollout(episodes=8, group_size=2, concurrency=8, seed=1, tasks=tasks):
            got.append(trajectory)
            if len(got) == 4:  # worker 1 is done; worker 0's four episodes are in flight
                os.kill(pids[0], signal.SIGKILL)
                time.sleep(0.5)
                marker.unlink()
        stats = runner.stats
    statuses = [t.status for t in got]
    assert len(got) == 8  # one trajectory per planned episode, always
    assert statuses[:4] == [Status.SUCCEEDED] * 4 and {t.task["id"] for t in got[:4]} == {1, 3}
    assert stats.workers_lost == 1 and stats.infra_failed == 4
    if retry:
        assert stats.retried == 4 and stats.recovered == 4 and statuses[4:] == [Status.SUCCEEDED] * 4
        assert {t.task["id"] for t in got[4:]} == {0}
    else:
        assert stats.retried == 0 and statuses[4:] == [Status.INFRA_FAILED] * 4
        assert all("rollout worker 0 was lost" in t.error and t.final_reward is None for t in got[4:])


def test_a_hung_worker_is_killed_after_worker_timeout(local_ray, tmp_path):
    marker = tmp_path / "hold"
    marker.touch()
    tasks = [{"id": 0, "calls": 1, "hold": str(marker)}]
    with RayRolloutRunner(make_env, Scripted, num_workers=1, worker_timeout=2.0) as runner:
        runner.worker_pids()  # started (actor start-up is not a hang)
        started = time.monotonic()
        out = runner.rollout(episodes=2, group_size=2, concurrency=2, seed=0, tasks=tasks)
        waited = time.monotonic() - started
    assert [t.status for t in out] == [Status.INFRA_FAILED] * 2 and "hung" in out[0].error
    assert runner.stats.workers_lost == 1
    assert waited < 15  # the timeout, not forever


def waiting_agent(task, ctx):
    ctx.chat_completion([{"role": "user", "content": str(task["id"])}])
    if "running" not in task:
        return "done"
    open(os.path.join(task["running"], uuid.uuid4().hex), "w").close()  # noqa: SIM115 - a marker file
    while not ctx.cancelled.is_set():  # a tool that never answers: only a stop ends it
        time.sleep(0.02)
    return "never"


def make_waiting_env(folder):
    return AgentEnv(waiting_agent, [{"id": i, "running": folder} for i in range(4)], lambda task, result: 1.0, seed_calls=True)


def test_stop_ends_the_workers_running_episodes_truncated_and_starts_no_other(local_ray, tmp_path):
    """What asynchronous training's shutdown does (``RayRolloutStream.stop``): the episodes running
    on the workers come back truncated, never infra_failed; the unstarted ones are not run, no
    worker is counted lost, and the workers run the next rollout whole."""
    with RayRolloutRunner(functools.partial(make_waiting_env, str(tmp_path)), Scripted, num_workers=2) as runner:
        stream = runner.iter_rollout(episodes=8, group_size=2, concurrency=4, seed=0)  # 2 running per worker
        stopped = []
        reader = threading.Thread(target=lambda: stopped.extend(stream))  # iterating drives the rollout
        reader.start()
        deadline = time.monotonic() + 120
        while len(os.listdir(tmp_path)) < 4:
            assert time.monotonic() < deadline, "the four episodes did not start"
            time.sleep(0.05)
        stream.stop()
        reader.join(120)
        assert not reader.is_alive(), "the stopped stream did not end"
        stream.close()
        stats = runner.take_stats()
        assert len(stopped) == 4 and {t.status for t in stopped} == {Status.TRUNCATED}
        assert all(len(t.steps) == 1 for t in stopped)  # what they did before the stop is kept
        assert stats.workers_lost == 0 and stats.infra_failed == 0
        again = runner.rollout(episodes=4, group_size=2, concurrency=4, seed=1, tasks=[{"id": 9, "calls": 1}] * 2, progress=False)
    assert len(again) == 4


def llm_agent(task, ctx):
    return ctx.chat_completion([{"role": "user", "content": task["q"]}], max_tokens=4).text


def make_llm_env():
    return AgentEnv(llm_agent, [{"q": f"question {i}"} for i in range(4)], lambda task, result: float(len(result) % 2))


def test_a_training_step_on_two_workers_rolls_out_what_one_process_does(local_ray, tiny_model_dir, tmp_path):
    pytest.importorskip("trl", reason="needs the train extra")
    from agentgym_lightning.policies.hf import HFPolicy
    from agentgym_lightning.trajectory import load_trajectories
    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer

    def step(workers):
        out = tmp_path / f"workers-{workers}"
        config = LightningRLConfig(
            env="scripted", model=str(tiny_model_dir), max_steps=1, tasks_per_step=2, num_generations=2, output_dir=str(out),
            report_to=[], progress=False, save_steps=1, rollout_workers=workers,
        )
        policy = HFPolicy(str(tiny_model_dir), device="cpu", default_max_tokens=4, num_threads=1)
        result = LightningRLTrainer(config, env=make_llm_env, policy=policy).train()
        return list(load_trajectories(out / "trajectories" / "step-000001.jsonl")), result.history[0]

    remote, remote_metrics = step(2)
    local, _ = step(0)
    assert len(remote) == 4 and remote_metrics["rollout/workers_lost"] == 0.0
    # Token ids and rewards equal; logprobs equal up to float rounding (a row's logits change in
    # the last bits with the batch it was computed in: the workers batch other rows than one process).
    remote, local = _content(remote), _content(local)
    remote_lp = [s.completion.logprobs for t in remote for s in t.steps]
    local_lp = [s.completion.logprobs for t in local for s in t.steps]
    assert all(remote_lp) and [len(x) for x in remote_lp] == [len(x) for x in local_lp]
    assert [v for x in remote_lp for v in x] == pytest.approx([v for x in local_lp for v in x], abs=1e-4)
    for t in remote + local:
        for s in t.steps:
            s.completion.logprobs = None
    assert remote == local


def two_agent(task, ctx):
    first = ctx.chat_completion([{"role": "user", "content": task["q"]}], max_tokens=4, metadata={"agent": "writer"})
    return ctx.chat_completion([{"role": "user", "content": first.text or "x"}], max_tokens=4, metadata={"agent": "rewriter"}).text


def make_two_agent_env():
    return AgentEnv(two_agent, [{"q": f"question {i}"} for i in range(4)], lambda task, result: float(len(result) % 2))


def test_with_an_adapter_per_agent_the_workers_calls_are_generated_with_their_agents_adapters(local_ray, tiny_model_dir, tmp_path):
    """lora_per_agent on Ray workers: each call reaches the trainer's generator with its agent's
    adapter (sent as the model name), so the workers roll out what one process does, with two
    adapters that write differently."""
    pytest.importorskip("peft", reason="needs the train extra")
    import torch

    from agentgym_lightning.policies.hf import HFPolicy
    from agentgym_lightning.trajectory import load_trajectories
    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer

    def step(workers):
        out = tmp_path / f"adapters-workers-{workers}"
        config = LightningRLConfig(
            env="scripted", model=str(tiny_model_dir), max_steps=1, tasks_per_step=2, num_generations=2, output_dir=str(out),
            report_to=[], progress=False, save_steps=1, rollout_workers=workers, lora_per_agent=True,
            agent_match="writer|rewriter", lora_r=4, lora_alpha=8,
        )
        policy = HFPolicy(str(tiny_model_dir), device="cpu", default_max_tokens=4, num_threads=1)
        trainer = LightningRLTrainer(config, env=make_two_agent_env, policy=policy)
        torch.manual_seed(0)
        with torch.no_grad():  # adapters that differ from each other and from the base model
            for name, param in trainer.model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0.0, 0.5)
        trainer.train()
        return _content(list(load_trajectories(out / "trajectories" / "step-000001.jsonl")))

    remote, local = step(2), step(0)
    ids = lambda ts: [[s.completion.completion_token_ids for s in t.steps] for t in ts]  # noqa: E731
    assert len(remote) == 4 and ids(remote) == ids(local)
