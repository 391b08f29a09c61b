"""The batched driver with a policy that takes calls one at a time (``submit``): each call is
handed over as it comes, answered when its own future resolves, failures settled per call.

Ordering, not timing, is asserted."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from agentgym_lightning import Completion, Status
from agentgym_lightning.env import AgentEnv
from agentgym_lightning.policies.base import schedules_per_step
from agentgym_lightning.rollouts.in_process import iter_rollout, rollout
from agentgym_lightning.training.generation import SamplingOverride


def agent(task, ctx):
    """Makes task["calls"] calls; returns the last answer."""
    client = ctx.openai_client()
    text = ""
    for i in range(task["calls"]):
        content = "poison" if task.get("poison") else f"{task['id']}:{i}"
        text = client.chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": content}]).choices[0].message.content
        if task.get("hang"):
            while not ctx.cancelled.is_set():
                time.sleep(0.01)
    return text


class Scheduled:
    """A policy with ``submit`` (answered on worker threads, after ``delay(request)`` seconds)
    and ``generate``; counts what it got each way."""

    def __init__(self, delay=lambda request: 0.0, fail=lambda request: None) -> None:
        self.pool = ThreadPoolExecutor(16)
        self.delay, self.fail = delay, fail
        self.submitted: list[str] = []
        self.batches: list[int] = []
        self.answered: list[str] = []  # in the order the futures resolved
        self.lock = threading.Lock()

    def _answer(self, request) -> Completion:
        time.sleep(self.delay(request))
        error = self.fail(request)
        if error is not None:
            raise error
        with self.lock:
            self.answered.append(request.messages[0]["content"])
        return Completion(text=request.messages[0]["content"])

    def submit(self, request) -> Future:
        self.submitted.append(request.messages[0]["content"])
        return self.pool.submit(self._answer, request)

    def generate(self, requests):
        self.batches.append(len(requests))
        return [self._answer(r) for r in requests]


def test_every_call_is_submitted_and_each_answer_goes_on_at_once():
    """Episode 0's calls are slow; the others' second calls are answered while it still runs
    (a batch would have held them behind it)."""
    policy = Scheduled(delay=lambda r: 1.0 if r.messages[0]["content"].startswith("0:") else 0.0)
    tasks = [{"id": i, "calls": 2} for i in range(4)]
    out = rollout(lambda: AgentEnv(agent, tasks, lambda t, r: 1.0), policy, episodes=4, concurrency=4, progress=False)
    assert all(t.status is Status.SUCCEEDED for t in out)
    assert sorted(policy.submitted) == sorted(f"{i}:{c}" for i in range(4) for c in range(2)) and policy.batches == []
    assert policy.answered.index("0:0") > max(policy.answered.index(f"{i}:1") for i in (1, 2, 3))
    assert sorted(t.result for t in out) == ["0:1", "1:1", "2:1", "3:1"]


def test_the_training_wrappers_keep_submit():
    policy = Scheduled()
    assert schedules_per_step(SamplingOverride(policy, temperature=1.0))
    assert not schedules_per_step(SamplingOverride(lambda requests: [], temperature=1.0))
    out = rollout(lambda: AgentEnv(agent, [{"id": 0, "calls": 2}], lambda t, r: 1.0), SamplingOverride(policy, temperature=0.5),
                  episodes=2, concurrency=2, progress=False)
    assert all(t.status is Status.SUCCEEDED for t in out) and len(policy.submitted) == 4 and policy.batches == []
    assert all(s.request.sampling.temperature is None for t in out for s in t.steps)  # the agent's own request is recorded


def test_a_rejected_call_fails_alone_and_a_dead_backend_is_the_infrastructure():
    policy = Scheduled(fail=lambda r: ValueError("top_p must be finite") if r.messages[0]["content"] == "poison" else None)
    tasks = [{"id": i, "calls": 2, "poison": i % 4 == 1} for i in range(8)]
    out = rollout(lambda: AgentEnv(agent, tasks, lambda t, r: 1.0), policy, episodes=8, concurrency=8, progress=False)
    bad = [t for t in out if t.task["poison"]]
    assert len(bad) == 2 and all(t.status is Status.TASK_FAILED and "top_p" in t.error for t in bad)
    assert all(t.status is Status.SUCCEEDED for t in out if not t.task["poison"])

    down = Scheduled(fail=lambda r: ConnectionError("connection refused"))
    ended = []
    with pytest.raises(ConnectionError):
        rollout(lambda: AgentEnv(agent, [{"id": 0, "calls": 1}]), down, episodes=40, concurrency=4, progress=False,
                on_trajectory=ended.append)
    assert 3 <= len(ended) <= 12 and all(t.status is Status.INFRA_FAILED for t in ended)


def test_a_call_refused_at_submit_gets_a_400():
    class Refusing(Scheduled):
        def submit(self, request):
            if request.messages[0]["content"] == "poison":
                raise ValueError("temperature must be >= 0")
            return super().submit(request)

    tasks = [{"id": 0, "calls": 1}, {"id": 1, "calls": 1, "poison": True}]
    out = rollout(lambda: AgentEnv(agent, tasks, lambda t, r: 1.0), Refusing(), episodes=2, concurrency=1, progress=False)
    assert [t.status for t in out] == [Status.SUCCEEDED, Status.TASK_FAILED]
    assert out[1].steps[0].error.startswith("400") and "temperature" in out[1].steps[0].error


def test_stopping_the_stream_cancels_the_calls_in_flight():
    started = threading.Event()
    futures: list[Future] = []

    class Never(Scheduled):
        def submit(self, request):
            future: Future = Future()
            futures.append(future)
            started.set()
            return future

    stream = iter_rollout(lambda: AgentEnv(agent, [{"id": 0, "calls": 1}], lambda t, r: 1.0), Never(), episodes=2, concurrency=2)
    threading.Thread(target=lambda: (started.wait(10), time.sleep(0.2), stream.stop()), daemon=True).start()
    out = list(stream)
    assert len(out) == 2 and all(t.status is Status.TRUNCATED for t in out)
    assert futures and all(f.cancelled() for f in futures)


class _BatchesOnly:
    """The policy's ``generate`` alone: the driver batches."""

    def __init__(self, policy) -> None:
        self.generate = policy.generate


def test_a_rollout_through_hf_submit_gives_the_tokens_of_batches(tiny_model_dir):
    """The main job's env, every call seeded (as the trainer samples): the same episodes, call
    for call and token for token, whether the driver submits each call or batches them."""
    pytest.importorskip("transformers")
    from agentgym_lightning.policies.hf import HFPolicy
    from agentgym_lightning.registration import make_env_factory

    factory = make_env_factory("lightning/Arithmetic-v0", {"difficulty": 3, "examples": 1})

    def make():
        env = factory()
        env.seed_calls = True
        return env

    policy = HFPolicy(str(tiny_model_dir), device="cpu", num_threads=1, progress=False, default_max_tokens=24)
    try:
        runs = {}
        for name, inner in (("batches", _BatchesOnly(policy)), ("submit", policy)):
            p = SamplingOverride(inner, temperature=1.0, max_tokens=24)
            assert schedules_per_step(p) == (name == "submit")
            out = sorted(rollout(make, p, episodes=8, group_size=4, concurrency=8, seed=3, progress=False), key=lambda t: t.seed)
            runs[name] = [[(s.completion.prompt_token_ids, s.completion.completion_token_ids) for s in t.steps if s.completion] for t in out]
        assert runs["submit"] == runs["batches"]
        assert sum(len(steps) for steps in runs["submit"]) >= 8
    finally:
        policy.close()
