"""The batched driver under hostile agents and requests: only the culprit episode pays.

Ordering, not timing, is asserted: healthy episodes must finish before a hung one is cut off.
"""

from __future__ import annotations

import time

import openai
import pytest

from agentgym_lightning import Completion, Status
from agentgym_lightning.env import AgentEnv
from agentgym_lightning.rollouts.in_process import rollout


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
        lambda: AgentEnv(agent, tasks, lambda task, result: 1.0, time_limit=3.0, stop_grace=0.5),
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
    assert max(t.ended_at for t in healthy) < hung[0].ended_at - 1.0
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
