"""The non-blocking face of rollout: trajectories as they finish (sync and async), work
submitted from other threads, and leaving early."""

from __future__ import annotations

import asyncio
import threading
import time

from agentgym_lightning import Completion, Status
from agentgym_lightning.env import AgentEnv
from agentgym_lightning.rollouts.in_process import RolloutStream, iter_rollout, rollout


def agent(task, ctx):
    time.sleep(task.get("sleep", 0))
    return ctx.chat_completion([{"role": "user", "content": str(task["id"])}]).text


def echo(requests):
    return [Completion(text=r.messages[-1]["content"]) for r in requests]


def make_env():
    return AgentEnv(agent, [{"id": 0}], lambda task, result: float(result == str(task["id"])), seed_calls=True)


def test_iter_rollout_yields_as_episodes_finish_and_matches_rollout():
    tasks = [{"id": i, "sleep": 0.3 if i == 0 else 0} for i in range(4)]
    stream = iter_rollout(make_env, echo, episodes=4, concurrency=4, tasks=tasks, seed=3)
    order = [t.task["id"] for t in stream]
    assert order[-1] == 0 and sorted(order) == [0, 1, 2, 3]  # the slow one last, nobody waited for it
    by_rollout = rollout(make_env, echo, episodes=4, concurrency=4, tasks=tasks, seed=3, progress=False)
    by_stream = list(iter_rollout(make_env, echo, episodes=4, concurrency=4, tasks=tasks, seed=3))
    for t in by_rollout + by_stream:
        t.group_id = None  # drawn afresh by every plan
    assert sorted(by_rollout, key=lambda t: t.seed) == sorted(by_stream, key=lambda t: t.seed)


def test_async_iteration_with_submissions_from_another_thread():
    stream = RolloutStream(make_env, echo, concurrency=2)
    started = []

    def producer():
        for i in range(5):
            stream.submit({"id": i}, on_start=lambda env: started.append(env.episode_id))
            time.sleep(0.01)
        stream.end()

    async def consume():
        threading.Thread(target=producer).start()
        return [t async for t in stream]

    out = asyncio.run(consume())
    assert sorted(t.result for t in out) == ["0", "1", "2", "3", "4"]
    assert all(t.status is Status.SUCCEEDED and t.final_reward == 1.0 for t in out)
    assert sorted(started) == sorted(t.episode_id for t in out)
    assert len({t.seed for t in out}) == 5  # distinct default seeds


def test_leaving_early_truncates_the_running_episodes_and_refuses_late_work():
    stream = RolloutStream(make_env, echo, concurrency=1)
    refused = []
    for i in range(3):
        stream.submit({"id": i, "sleep": 0.2 if i else 0}, on_start=lambda env: refused.append(env) if env is None else None)
    first = next(iter(stream))
    stream.close()
    assert first.status is Status.SUCCEEDED
    assert refused == [None]  # the second was running (truncated); the third never started: told so


def test_stop_from_another_thread_yields_the_running_episodes_as_truncated():
    stream = RolloutStream(make_env, echo, concurrency=2)
    stream.submit({"id": 0, "sleep": 1})
    threading.Timer(0.2, stream.stop).start()
    (t,) = list(stream)
    assert t.status is Status.TRUNCATED and "stopped" in t.error


def test_a_stream_left_by_an_exception_cancels_the_calls_its_policy_is_still_generating():
    """Before: a Ctrl-C or SIGTERM out of the driver left the submitted calls running, so an
    ``hf`` policy decoded them to their end on its own thread, for episodes already closed."""
    from concurrent.futures import Future

    import pytest

    class Scheduling:
        def __init__(self):
            self.futures = []

        def generate(self, requests):  # the batch path a scheduling policy keeps
            raise AssertionError("calls go one at a time to submit")

        def submit(self, request):
            if self.futures:
                raise KeyboardInterrupt  # the signal, arriving while the first call is generated
            self.futures.append(Future())
            return self.futures[0]

    policy = Scheduling()
    stream = RolloutStream(make_env, policy, concurrency=2)
    stream.submit({"id": 0})
    stream.submit({"id": 1, "sleep": 0.2})
    with pytest.raises(KeyboardInterrupt):
        list(stream)
    assert len(policy.futures) == 1 and policy.futures[0].cancelled()
