"""The batched driver under hostile agents and requests: only the culprit episode pays; and with
a policy that takes calls one at a time (``submit``).

Ordering, not timing, is asserted: healthy episodes must finish before a hung one is cut off.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import openai
import pytest

from agentgym_lightning import Completion, Status
from agentgym_lightning.env import AgentEnv
from agentgym_lightning.policies.base import schedules_per_step
from agentgym_lightning.rollouts.in_process import iter_rollout, rollout
from agentgym_lightning.training.generation import SamplingOverride


def agent(task, ctx):
    """Makes task["calls"] calls through the OpenAI client; hangs after the first if asked."""
    client = ctx.openai_client()
    text = ""
    for i in range(task["calls"]):
        content = "poison" if task.get("poison") else f"{task['id']}:{i}"
        text = client.chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": content}]).choices[0].message.content
        if task.get("hang"):
            while not ctx.cancelled.is_set():  # a tool that never returns, until the episode is cut
                time.sleep(0.01)
    return text


def echo(requests):
    return [Completion(text=r.messages[0]["content"]) for r in requests]


def test_a_hung_agent_never_holds_the_other_episodes(resources):
    before = resources.snapshot()
    tasks = [{"id": 0, "calls": 3, "hang": True}] + [{"id": i, "calls": 3} for i in range(1, 8)]
    out = rollout(
        # 6 s: under a loaded CI the healthy episodes' 3 calls alone took 2.3 s (their first calls are slow).
        lambda: AgentEnv(agent, tasks, lambda task, result: 1.0, time_limit=6.0, stop_grace=0.5),
        echo,
        episodes=8,
        concurrency=8,
        progress=False,
    )
    hung = [t for t in out if t.task.get("hang")]
    healthy = [t for t in out if not t.task.get("hang")]
    assert len(healthy) == 7 and all(t.status is Status.SUCCEEDED for t in healthy)
    assert hung[0].status is Status.TRUNCATED and "time limit" in hung[0].error
    # Before: every round waited for the hung agent, so the healthy ones ended after it.
    assert max(t.ended_at for t in healthy) < hung[0].ended_at - 2.0
    assert out[-1] is hung[0]
    resources.assert_no_leaks(before)


def test_a_request_the_backend_rejects_fails_only_its_own_call():
    """Several bad requests, alone and inside batches: each agent that sent one gets a 400; the
    others are answered; the run is not aborted (before: 8 of 8 infra_failed, then raised)."""
    batches = []

    def picky(requests):
        batches.append(len(requests))
        if any(r.messages[0]["content"] == "poison" for r in requests):
            raise ValueError("top_p must be a finite number")
        return echo(requests)

    tasks = [{"id": i, "calls": 2, "poison": i % 4 == 1} for i in range(16)]
    out = rollout(
        lambda: AgentEnv(agent, tasks, lambda task, result: 1.0),
        picky,
        episodes=16,
        concurrency=8,
        progress=False,
    )
    bad = [t for t in out if t.task["poison"]]
    good = [t for t in out if not t.task["poison"]]
    assert len(bad) == 4 and len(good) == 12
    assert all(t.status is Status.SUCCEEDED for t in good)
    for t in bad:  # the agent did not catch the 400: its own failure, not the infrastructure's
        assert t.status is Status.TASK_FAILED and "BadRequestError" in t.error and "top_p" in t.error
        assert t.steps[0].error.startswith("400") and t.steps[0].completion is None


def test_lone_bad_requests_are_told_apart_from_a_dead_backend():
    """One episode at a time: a request that fails alone is probed against a request the
    backend answered before; more than MAX_POLICY_FAILURES of them do not abort the run."""
    tasks = [{"id": 0, "calls": 1}] + [{"id": i, "calls": 1, "poison": True} for i in range(1, 5)]

    def picky(requests):
        if any(r.messages[0]["content"] == "poison" for r in requests):
            raise ValueError("unknown role")
        return echo(requests)

    out = rollout(lambda: AgentEnv(agent, tasks, lambda t, r: 1.0), picky, episodes=5, concurrency=1, progress=False)
    assert [t.status for t in out] == [Status.SUCCEEDED] + [Status.TASK_FAILED] * 4


def test_an_agent_may_handle_the_400_itself():
    def careful(task, ctx):
        client = ctx.openai_client()

        def ask(content):
            return client.chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": content}])

        ask("hello")
        try:
            ask("poison")
        except openai.BadRequestError:
            pass
        return ask("ok").choices[0].message.content

    def picky(requests):
        if any(r.messages[0]["content"] == "poison" for r in requests):
            raise ValueError("image content parts are not supported")
        return echo(requests)

    out = rollout(
        lambda: AgentEnv(careful, [{}], lambda t, r: float(r == "ok")), picky, episodes=3, concurrency=3, progress=False
    )
    assert all(t.status is Status.SUCCEEDED and t.final_reward == 1.0 for t in out)
    assert all([s.error is not None for s in t.steps] == [False, True, False] for t in out)


def test_a_backend_that_fails_from_the_first_request_is_the_infrastructure():
    """With no request ever answered there is nothing to probe: a failure of every request is
    the backend's, so those episodes are infra_failed (never trained on), and the run stops."""
    ended = []

    def down(requests):
        raise ConnectionError("connection refused")

    with pytest.raises(ConnectionError):
        rollout(lambda: AgentEnv(agent, [{"id": 0, "calls": 1}]), down, episodes=40, concurrency=4, progress=False,
                on_trajectory=ended.append)
    assert 3 <= len(ended) <= 12 and all(t.status is Status.INFRA_FAILED for t in ended)


def test_max_batch_size_and_continuous_batching():
    sizes = []

    def policy(requests):
        sizes.append(len(requests))
        return echo(requests)

    tasks = [{"id": i, "calls": 3} for i in range(10)]
    out = rollout(
        lambda: AgentEnv(agent, tasks, lambda t, r: 1.0), policy, episodes=10, concurrency=10, progress=False, max_batch_size=4
    )
    assert all(t.status is Status.SUCCEEDED for t in out)
    assert max(sizes) <= 4 and sum(sizes) == 30


@pytest.mark.parametrize("bad", [{"max_batch_wait": -1}, {"max_batch_size": 0}])
def test_bad_driver_options_are_refused(bad):
    with pytest.raises(ValueError):
        rollout(lambda: AgentEnv(agent, [{"id": 0, "calls": 1}]), echo, episodes=1, progress=False, **bad)


def test_an_agent_with_parallel_calls_gets_every_one_answered():
    """Calls queued behind one another in one env are collected after each answer, with no
    wake-up of their own (their notices came while the env was still waiting on the policy)."""
    import threading

    def parallel(task, ctx):
        out = []

        def call(i):
            out.append(ctx.chat_completion([{"role": "user", "content": str(i)}]).text)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sorted(out)

    out = rollout(
        lambda: AgentEnv(parallel, [{}], lambda t, r: float(r == ["0", "1", "2"]), time_limit=20), echo,
        episodes=6, concurrency=3, progress=False,
    )
    assert all(t.status is Status.SUCCEEDED and t.final_reward == 1.0 and len(t.steps) == 3 for t in out)


def test_a_slow_policy_never_truncates_agents_through_their_time_limit():
    from agentgym_lightning.env import AgentEnv
    from agentgym_lightning.rollouts.in_process import rollout

    def two_calls(task, ctx):
        ctx.chat_completion([{"role": "user", "content": "1"}])
        return ctx.chat_completion([{"role": "user", "content": "2"}]).text

    def slow_policy(requests):
        time.sleep(0.4)  # each batch takes longer than an episode's whole time limit
        return ["ok"] * len(requests)

    out = rollout(lambda: AgentEnv(two_calls, [{}], lambda t, r: 1.0, time_limit=0.3), slow_policy,
                  episodes=4, concurrency=4, progress=False)
    assert [t.status.value for t in out] == ["succeeded"] * 4


# ------------------------------------------------------------------------------ a policy that takes calls one at a time
# (``submit``): each call is handed over as it comes, answered when its own future resolves,
# failures settled per call.


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


def test_a_call_rejected_before_the_backend_answered_any_waits_for_the_calls_in_flight():
    # Before: the poisoned call failed first, there was no answered request to probe the backend
    # with, so the backend was taken for down and its episode ended infra_failed (a CI flake of
    # the test above, whenever a poisoned call was settled before any other).
    def fail(request):
        if request.messages[0]["content"] != "poison":
            return None
        deadline = time.monotonic() + 10
        while len(policy.submitted) < 4 and time.monotonic() < deadline:  # every call in flight
            time.sleep(0.005)
        return ValueError("top_p must be finite")

    policy = Scheduled(delay=lambda r: 0.0 if r.messages[0]["content"] == "poison" else 0.5, fail=fail)
    tasks = [{"id": 0, "calls": 1, "poison": True}] + [{"id": i, "calls": 1} for i in (1, 2, 3)]
    out = rollout(lambda: AgentEnv(agent, tasks, lambda t, r: 1.0), policy, episodes=4, concurrency=4, progress=False)
    (bad,) = [t for t in out if t.task.get("poison")]
    assert bad.status is Status.TASK_FAILED and "top_p" in bad.error and bad.steps[0].error.startswith("400")
    assert all(t.status is Status.SUCCEEDED for t in out if not t.task.get("poison"))


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
