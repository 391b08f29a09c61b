"""Many episodes at once: the batched driver, GRPO groups, and no deadlock under random use."""

from __future__ import annotations

import threading
import time

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

from agentgym_lightning import Completion, Status
from agentgym_lightning.env import AgentEnv
from agentgym_lightning.rollouts.in_process import rollout


def counting_agent(task, ctx):
    """Makes task["calls"] calls; its isolated state is the list of answers it saw."""
    seen = []
    for i in range(task["calls"]):
        seen.append(ctx.chat_completion([{"role": "user", "content": f"{task['id']}:{i}:{len(seen)}"}]).text)
        ctx.emit_variable("seen", list(seen))
    return seen


def test_100_concurrent_episodes_in_lock_step_rounds():
    """max_batch_wait=None: every batch waits for every running agent (one generate a round)."""
    tasks = [{"id": i, "calls": 3} for i in range(25)]
    batch_sizes = []

    def policy(requests):
        batch_sizes.append(len(requests))
        # answer with the request's own content so cross-episode mixups would show
        return [Completion(text=r.messages[0]["content"]) for r in requests]

    trajectories = rollout(
        lambda: AgentEnv(counting_agent, tasks, lambda t, r: float(len(r) == 3)),
        policy,
        episodes=100,
        group_size=4,
        concurrency=100,
        progress=False,
        max_batch_wait=None,
    )
    assert len(trajectories) == 100
    assert all(t.status is Status.SUCCEEDED and t.final_reward == 1.0 for t in trajectories)
    assert batch_sizes[0] == 100 and sum(batch_sizes) == 300
    for t in trajectories:  # each episode saw only its own answers
        assert t.result == [f"{t.task['id']}:{i}:{i}" for i in range(3)]
    groups: dict[str, list] = {}
    for t in trajectories:
        groups.setdefault(t.group_id, []).append(t)
    assert len(groups) == 25 and all(len(g) == 4 for g in groups.values())
    assert all(len({t.task["id"] for t in g}) == 1 for g in groups.values())
    assert len({t.episode_id for t in trajectories}) == 100


def test_a_failing_policy_marks_episodes_infra_failed_then_raises():
    calls = []
    ended = []

    def broken(requests):
        calls.append(len(requests))
        raise RuntimeError("CUDA out of memory")

    import pytest

    with pytest.raises(RuntimeError, match="out of memory"):
        rollout(
            lambda: AgentEnv(counting_agent, [{"id": 0, "calls": 2}]),
            broken,
            episodes=10,
            concurrency=2,
            progress=False,
            on_trajectory=ended.append,
            max_batch_wait=None,
        )
    # Three failed batches of 2, each retried request by request first (a backend that fails
    # every request is the infrastructure, not a bad request), then the error is raised.
    assert calls == [2, 1, 1] * 3
    assert len(ended) == 6 and all(t.status is Status.INFRA_FAILED for t in ended)


def test_rollout_reports_every_finished_trajectory_as_it_goes():
    got = []
    out = rollout(
        lambda: AgentEnv(counting_agent, [{"id": 0, "calls": 1}]),
        lambda reqs: ["x"] * len(reqs),
        episodes=5,
        concurrency=2,
        progress=False,
        on_trajectory=got.append,
    )
    assert got == out and len(out) == 5


ACTIONS = st.lists(
    st.one_of(
        st.tuples(st.just("step"), st.text(max_size=20)),
        st.tuples(st.just("reset"), st.integers(0, 3)),
        st.tuples(st.just("close"), st.none()),
    ),
    max_size=25,
)


def _random_agent(task, ctx):
    # Varied behaviour: parallel calls, crashes, early returns, sleeps.
    mode = task["mode"]
    if mode == "crash-early":
        raise RuntimeError("boom")
    if mode == "parallel":
        out = []

        def call():
            try:
                out.append(ctx.chat_completion([{"role": "user", "content": "p"}]))
            except Exception as exc:  # noqa: BLE001 - refused once the episode ends; recorded
                out.append(exc)

        ts = [threading.Thread(target=call) for _ in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return len(out)
    for i in range(task["calls"]):
        ctx.chat_completion([{"role": "user", "content": str(i)}])
        if mode == "crash-late" and i == 1:
            raise ValueError("late boom")
        if mode == "slow":
            time.sleep(0.001)
    return None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=ACTIONS)
def test_random_action_sequences_never_deadlock(actions):
    tasks = [
        {"mode": "plain", "calls": 3},
        {"mode": "crash-early", "calls": 0},
        {"mode": "parallel", "calls": 2},
        {"mode": "crash-late", "calls": 4},
    ]
    env = AgentEnv(_random_agent, tasks, max_turns=3, time_limit=5.0, stop_grace=0.5)
    running = False
    t0 = time.monotonic()
    for kind, arg in actions:
        if kind == "reset":
            env.reset(seed=arg, options={"task_index": arg})
            running = True  # even an episode over at reset is ended by the next step()
        elif kind == "step":
            if not running:
                continue
            _, _, term, trunc, info = env.step(arg)
            if term or trunc:
                running = False
                assert info["trajectory"].status is not Status.RUNNING
        else:
            env.close()
            running = False
    env.close()
    assert time.monotonic() - t0 < 30
