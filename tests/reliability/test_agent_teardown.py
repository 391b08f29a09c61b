"""Nothing an episode started outlives it: sockets, descriptors, threads (issue 11, item 7).

What CPython cannot do — interrupt a thread blocked in a C call — is bounded and reported.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import openai
import pytest

from agentgym_lightning.agent import AgentCancelled
from agentgym_lightning.env import AgentEnv
from agentgym_lightning.gateway import Gateway
from agentgym_lightning.gateway.limits import GatewayLimits

USER = [{"role": "user", "content": "x"}]


def mixed_agent(task, ctx):
    """Ways an agent over HTTP ends: normally, raising, cut short, sending garbage, its own clients."""
    kind = task["kind"]
    if kind == "ok":
        client = ctx.openai_client()
        client.chat.completions.create(model="m", messages=USER)
        return "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(model="m", messages=USER, stream=True) if c.choices)
    if kind == "raise":
        ctx.openai_client().chat.completions.create(model="m", messages=USER)
        raise RuntimeError("agent bug")
    if kind == "too-many-turns":  # truncated at max_turns; its next call is refused
        client = ctx.openai_client()
        for _ in range(10):
            client.chat.completions.create(model="m", messages=USER)
    if kind == "bad-request":
        http = ctx.http_client()
        http.post(f"{ctx.base_url}/chat/completions", content=b"{not json")
        return ctx.openai_client().chat.completions.create(model="m", messages=USER).choices[0].message.content
    if kind == "own-client":  # never closed by the agent: the gateway's side must still end
        return openai.OpenAI(base_url=ctx.base_url, api_key="k", max_retries=0).chat.completions.create(
            model="m", messages=USER
        )
    if kind == "slow":  # past the time limit; wakes up to a refused call
        ctx.openai_client().chat.completions.create(model="m", messages=USER)
        time.sleep(0.6)
        return ctx.openai_client().chat.completions.create(model="m", messages=USER)
    raise AssertionError(kind)


async def mixed_async_agent(task, ctx):
    http = ctx.async_http_client()  # left open: stop() closes it
    r = await http.post(f"{ctx.base_url}/chat/completions", json={"messages": USER})
    if task["kind"] == "async-raise":
        raise RuntimeError("async agent bug")
    return r.status_code


def run_episode(env: AgentEnv) -> str:
    obs, info = env.reset(seed=0)
    if info.get("episode_over"):
        return info["status"]
    while True:
        *_, term, trunc, info = env.step("x")
        if term or trunc:
            return info["status"]


def test_mixed_fault_http_episodes_leave_no_thread_fd_or_socket(resources):
    gw = Gateway()
    gw.start()
    # The agents' loop resolves host names on its default executor: grow that pool to its
    # maximum first, so its threads (process-lifetime, bounded) cannot appear during the count.

    async def fill_executor() -> None:
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(None, time.sleep, 0.05) for _ in range(64)))

    gw.background_loop().submit(fill_executor()).result(10)
    kinds = ["ok", "raise", "too-many-turns", "bad-request", "own-client", "slow", "async-ok", "async-raise"]
    envs = [
        AgentEnv(
            mixed_async_agent if k.startswith("async") else mixed_agent,
            [{"kind": k}],
            gateway=gw,
            transport="http",
            max_turns=3,
            time_limit=0.4,
            stop_grace=0.5,
        )
        for k in kinds
    ]
    before = resources.snapshot()
    statuses = []
    workers = [threading.Thread(target=lambda e=e: statuses.extend(run_episode(e) for _ in range(3))) for e in envs]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert sorted(set(statuses)) == ["succeeded", "task_failed", "truncated"] and len(statuses) == 24
    # The envs are kept (a trainer keeps its envs for the whole run); before: 12 fds and
    # sockets per 200 episodes stayed open with them.
    resources.assert_no_leaks(before, settle_s=5.0)
    for e in envs:
        e.close()
    gw.close()


class _SlowFinalizer:
    def __del__(self) -> None:  # Python code: an exception raised in here is only printed
        end = time.monotonic() + 0.005
        while time.monotonic() < end:
            pass


def swallowing_agent(task, ctx):
    """Swallows every ``Exception`` and calls again, forever, spending half its time in a
    ``__del__`` where an asynchronously raised AgentCancelled is lost."""
    client = (
        openai.OpenAI(base_url=ctx.base_url, api_key="k", max_retries=0)
        if task["own_client"]
        else ctx.openai_client()
    )
    while True:
        try:
            _SlowFinalizer()
            end = time.monotonic() + 0.005
            while time.monotonic() < end:
                pass
            client.chat.completions.create(model="m", messages=USER)
        except Exception:  # noqa: BLE001, S112 - the hostile agent under test
            pass


@pytest.mark.parametrize("transport, own_client", [("inproc", False), ("http", True)])
def test_agents_that_swallow_exceptions_and_keep_calling_are_stopped(resources, monkeypatch, transport, own_client):
    # pytest's own hook would keep every exception lost in the __del__ (with the agent's frames,
    # and its client's socket) until the test ends: drop them, as Python's default hook does.
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: None)
    gw = Gateway()
    gw.start()
    before = resources.snapshot()
    envs = [
        AgentEnv(swallowing_agent, [{"own_client": own_client}], gateway=gw, transport=transport, stop_grace=0.5)
        for _ in range(8)
    ]
    for env in envs:
        env.reset(seed=0)
        env.step_async("once")
    closers = [threading.Thread(target=env.close) for env in envs]
    for c in closers:
        c.start()
    for c in closers:
        c.join(30)
    # Before: most of them outlived stop() (one raise, lost in the __del__), and a raise that
    # landed inside the shared in-process client's cookie-jar lock froze every other agent.
    resources.assert_no_leaks(before, settle_s=3.0)
    assert gw.lingering_agents() == []
    gw.close()


def stubborn_agent(task, ctx):
    """Calls over its own client and loses the first five AgentCancelled raised in it, as a raise
    delivered inside a ``__del__`` is lost; then lets one through."""
    client = openai.OpenAI(base_url=ctx.base_url, api_key="k", max_retries=0)
    lost = 0
    while True:
        try:
            client.chat.completions.create(model="m", messages=USER)
        except AgentCancelled:
            lost += 1
            task["lost"] = lost
            if lost > 5:
                raise
        except Exception:  # noqa: BLE001, S112 - the hostile agent under test
            pass


def test_a_worker_left_running_is_stopped_again_until_it_ends(resources):
    # Before: stop() raised three times and gave up, and the agent (its calls go over its own
    # HTTP client, past this process's per-call guard) ran on, spinning, for ever.
    gw = Gateway()
    gw.start()
    before = resources.snapshot()
    task = {"lost": 0}
    env = AgentEnv(stubborn_agent, [task], gateway=gw, transport="http", stop_grace=0.2)
    env.reset(seed=0)
    env.step_async("once")
    env.close()
    assert "did not stop" in env.trajectory.error
    deadline = time.monotonic() + 10
    while gw.lingering_agents() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gw.lingering_agents() == []
    # It caught at least the three raises of stop()'s grace, so what ended it came after (six,
    # unless one landed inside its handler).
    assert task["lost"] >= 3
    resources.assert_no_leaks(before, settle_s=3.0)  # the agent's thread and the one that stopped it
    gw.close()


def test_agents_blocked_in_c_calls_are_reported_and_bounded():
    gw = Gateway(limits=GatewayLimits(max_lingering_agents=3))

    def sleeper(task, ctx):
        ctx.chat_completion(USER)
        time.sleep(2)  # nothing in CPython can interrupt this in a non-main thread

    live = AgentEnv(lambda task, ctx: ctx.chat_completion(USER).text, [{}], gateway=gw)
    live.reset(seed=0)  # an episode in progress when resets start being refused
    envs = [AgentEnv(sleeper, [{}], gateway=gw, stop_grace=0.1) for _ in range(3)]
    for env in envs:
        env.reset(seed=0)
        env.step_async("go")
    time.sleep(0.2)
    for env in envs:
        env.close()
    for env in envs:
        assert "did not stop" in env.trajectory.error and "time.sleep(2)" in env.trajectory.error
    assert len(gw.lingering_agents()) == 3
    with pytest.raises(RuntimeError, match="3 agent workers outlived their episodes.*time.sleep"):
        AgentEnv(sleeper, [{}], gateway=gw).reset(seed=0)
    with pytest.raises(RuntimeError, match="outlived"):
        live.reset(seed=1)
    assert live.step("kept")[4]["trajectory"].result == "kept"  # the refused reset left it as it was
    deadline = time.monotonic() + 10
    while gw.lingering_agents() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gw.lingering_agents() == []  # each ended as its sleep returned (AgentCancelled was pending)
    env = AgentEnv(lambda task, ctx: ctx.chat_completion(USER).text, [{}], gateway=gw)
    env.reset(seed=0)
    assert env.step("again")[4]["trajectory"].result == "again"
    gw.close()


def test_a_worker_whose_thread_start_was_interrupted_is_ended_not_an_error():
    """A Ctrl-C that strikes ``Thread.start()`` while it waits for the thread to say it runs leaves
    a thread ``join()`` refuses ("cannot join thread before it is started"): stopping its worker
    turned an interrupted run's exit 130 into a failure (issue 50 item 8, 1 run in 7 under load)."""
    from types import SimpleNamespace

    from agentgym_lightning.worker import AgentWorker

    never_said_it_runs = threading.Thread(target=lambda: None)
    worker = SimpleNamespace(_thread=never_said_it_runs, _future=None)
    assert AgentWorker._join(worker, 0.1) is True
