"""Hostile clients against the gateway: the figures behind ``docs/limits.md`` (issue 11).

    python bench/hostile_gateway.py bodies     # peak RSS while 20 clients send 10 MB bodies at once
    python bench/hostile_gateway.py chunked    # the same, chunked (no Content-Length to refuse up front)
    python bench/hostile_gateway.py headers    # a 10 MB header and a 100 MB body: accepted or refused?
    python bench/hostile_gateway.py idle       # sockets still open 10 s after 1,500 idle connections
    python bench/hostile_gateway.py emfile     # 1,100 idle sockets under a 1,024-fd limit: can agents still work?
    python bench/hostile_gateway.py leaks      # threads, fds and sockets left after 200 mixed-fault HTTP episodes
    python bench/hostile_gateway.py sleepers   # threads left after closing 20 agents blocked in time.sleep
    python bench/hostile_gateway.py swallow    # of 50 agents that swallow Exception and keep calling, how many outlive stop()
    python bench/hostile_gateway.py errors     # issue 11 item 6's requests: status, shape, steps recorded
    python bench/hostile_gateway.py poison     # 8 agents on the hf backend, one sending item 3's poisons: who fails
    python bench/hostile_gateway.py work       # issue 37 item 12: bodies that cost work, not bytes, beside innocent agents
    python bench/hostile_gateway.py otlp       # issue 37 item 13: nested OTLP attribute values (protobuf, JSON)
    python bench/hostile_gateway.py answers    # issue 37 item 14: the 500s, the 413's shape, a billion-token call, forged spans
    python bench/hostile_gateway.py slow       # issue 50 item 6: 60 clients sending 8 MB bodies slowly, beside innocent agents
    python bench/hostile_gateway.py pipelined  # issue 50 item 6: 50 pipelined requests on one connection: how many answered

``work``, ``otlp`` and ``answers`` take ``--only "NAME[;NAME]"`` (a payload's name) and
``--timeout S`` (per hostile request), to measure a revision that does not survive them all.

Each stage runs in a fresh process (peak RSS is per process) with the gateway's defaults and
uses only public API, so the same script measures any revision. The hostile clients run in a
child process, so their own buffers never count in the gateway's memory. Numbers from a shared
machine are noisy: repeat a stage and compare revisions in one sitting.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import resource
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import psutil  # noqa: E402

from agentgym_lightning.env import AgentEnv  # noqa: E402
from agentgym_lightning.gateway import get_gateway  # noqa: E402

PROC = psutil.Process()

# --------------------------------------------------------------------------- child-side clients

SENDER = r"""
import json, socket, sys, threading
host, port, path, count, size, header_size, chunked = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7] == "1"
statuses = []

def frame(data):
    return b"%x\r\n%s\r\n" % (len(data), data) if chunked else data

def one():
    prefix = b'{"messages": [{"role": "user", "content": "'
    suffix = b'"}]}'
    filler = max(0, size - len(prefix) - len(suffix))
    try:
        s = socket.create_connection((host, port))
    except OSError as exc:
        statuses.append(f"connect: {type(exc).__name__}")
        return
    s.settimeout(20)
    length = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(prefix) + filler + len(suffix)}"
    head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{length}\r\n"
    if header_size:
        head += "X-Big: " + "a" * header_size + "\r\n"
    try:
        s.sendall(head.encode() + b"\r\n" + frame(prefix))
        chunk = b"x" * 65536
        sent = 0
        while sent < filler:
            n = min(len(chunk), filler - sent)
            s.sendall(frame(chunk[:n]))
            sent += n
        s.sendall(frame(suffix) + (b"0\r\n\r\n" if chunked else b""))
    except OSError:
        pass  # refused while sending: read the answer, as httpx does
    try:
        reply = s.recv(200)
        statuses.append(reply.split(b"\r\n", 1)[0].decode(errors="replace") or "closed without an answer")
    except OSError as exc:
        statuses.append(type(exc).__name__)
    finally:
        s.close()

ts = [threading.Thread(target=one) for _ in range(count)]
for t in ts: t.start()
for t in ts: t.join()
print(json.dumps(statuses))
"""

IDLER = r"""
import socket, sys, time
host, port, count, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
socks = []
for _ in range(count):
    try:
        socks.append(socket.create_connection((host, port), timeout=5))
    except OSError:
        pass
print(len(socks), flush=True)
time.sleep(hold)
"""


def _gateway_connections(port: int) -> int:
    """Server-side connections of this process on the gateway's port that are still open."""
    return sum(
        1
        for c in PROC.net_connections(kind="tcp")
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED
    )


def _snapshot() -> tuple[int, int, int]:
    gc.collect()
    return threading.active_count(), PROC.num_fds(), len(PROC.net_connections(kind="all"))


def _blocked_episode(hold: float = 120.0) -> tuple[AgentEnv, threading.Event, threading.Thread]:
    """An episode whose agent makes no call until released (or ``hold`` seconds): its URL
    exists for hostile clients."""
    started, release = threading.Event(), threading.Event()

    def agent(task, ctx):
        started.set()
        release.wait(hold)

    env = AgentEnv(agent, [{}], time_limit=hold)
    t = threading.Thread(target=env.reset, kwargs={"seed": 0}, daemon=True)
    t.start()
    started.wait(10)
    return env, release, t


# --------------------------------------------------------------------------- stages


def stage_bodies(
    args: argparse.Namespace, *, count: int = 20, size: int = 10 * 2**20, header: int = 0, chunked: bool = False
) -> None:
    gw = get_gateway()
    gw.start()
    env, release, t = _blocked_episode()
    path = f"/episodes/{env.episode_id}/v1/chat/completions"
    gc.collect()
    base = PROC.memory_info().rss / 2**20
    out = subprocess.run(
        [sys.executable, "-c", SENDER, gw.host, str(gw.port), path, str(count), str(size), str(header), str(int(chunked))],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    statuses = json.loads(out.stdout)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    steps = len(env.trajectory.steps)
    release.set()
    env.close()
    t.join(5)
    summary: dict[str, int] = {}
    for s in statuses:
        summary[s] = summary.get(s, 0) + 1
    print(
        f"{count} x {size / 2**20:.0f} MB {'chunked ' if chunked else ''}bodies"
        f"{f' + {header / 2**20:.0f} MB header' if header else ''}: "
        f"RSS before {base:.0f} MB, peak {peak:.0f} MB (+{peak - base:.0f} MB); "
        f"responses {summary}; steps recorded {steps}"
    )


def stage_headers(args: argparse.Namespace) -> None:
    stage_bodies(args, count=1, size=1000, header=10 * 2**20)
    stage_bodies(args, count=1, size=100 * 2**20)


def stage_idle(args: argparse.Namespace, *, count: int = 1500, wait: float = 10.0) -> None:
    gw = get_gateway()
    gw.start()
    child = subprocess.Popen(
        [sys.executable, "-c", IDLER, gw.host, str(gw.port), str(count), str(wait + 30)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    opened = int(child.stdout.readline())
    time.sleep(1.0)
    at_open = _gateway_connections(gw.port)
    time.sleep(wait - 1.0)
    left = _gateway_connections(gw.port)
    child.kill()
    child.wait()
    print(f"{opened} idle connections opened: {at_open} open at the gateway after 1 s, {left} still open after {wait:.0f} s")


def stage_emfile(args: argparse.Namespace, *, count: int = 1100) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    tmp = tempfile.mkdtemp()  # before the flood: creating it may need a descriptor
    gw = get_gateway()
    gw.start()
    child = subprocess.Popen(
        [sys.executable, "-c", IDLER, gw.host, str(gw.port), str(count), "60"],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)),  # the client is not limited
    )
    assert child.stdout is not None
    opened = int(child.stdout.readline())
    time.sleep(1.0)
    try:
        held: int | str = _gateway_connections(gw.port)
    except OSError as exc:
        held = f"? ({exc.strerror})"
    results: dict[str, str] = {}

    def agent(task, ctx):
        try:
            reply = ctx.openai_client().chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
            results["http call"] = "ok: " + str(reply.choices[0].message.content)
        except Exception as exc:  # noqa: BLE001 - the figure we report
            results["http call"] = f"failed: {type(exc).__name__}: {exc}"[:120]

    env = AgentEnv(agent, [{}], transport="http", time_limit=20)
    try:
        env.reset(seed=0)
        env.step("fine")
    except OSError as exc:
        results["http call"] = f"failed: {exc}"[:120]
    except Exception as exc:  # noqa: BLE001 - the figure we report
        results["episode"] = f"failed: {type(exc).__name__}: {exc}"[:120]
    try:
        db = sqlite3.connect(os.path.join(tmp, "x.db"))
        db.execute("create table t (x)")
        db.close()
        results["sqlite open"] = "ok"
    except sqlite3.Error as exc:
        results["sqlite open"] = f"failed: {exc}"
    child.kill()
    child.wait()
    print(f"fd limit 1024, {opened} idle connections opened, {held} held by the gateway after 1 s: {results}")


def mixed_agent(task, ctx):
    """One of several ways an agent can fail; every one talks to the gateway over HTTP."""
    import httpx
    import openai

    kind = task["kind"]
    if kind == "ok":
        c = ctx.openai_client()
        c.chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": "a"}])
        return c.chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": "b"}], stream=True)
    if kind == "raise":
        ctx.openai_client().chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": "a"}])
        raise RuntimeError("agent bug")
    if kind == "too-many-turns":
        c = ctx.openai_client()
        for _ in range(10):
            c.chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": "again"}])
    if kind == "bad-request":
        http = ctx.http_client()
        http.post(f"{ctx.base_url}/chat/completions", content=b"{not json")
        http.post(f"{ctx.base_url}/chat/completions", json={"messages": "nope"})
        return ctx.openai_client().chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": "a"}])
    if kind == "own-client":
        c = openai.OpenAI(base_url=ctx.base_url, api_key=ctx.api_key, max_retries=0)
        return c.chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": "a"}])
    if kind == "raw-httpx":
        with httpx.Client() as http:
            return http.post(f"{ctx.base_url}/chat/completions", json={"messages": [{"role": "user", "content": "a"}]}).status_code
    if kind == "slow":
        ctx.openai_client().chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": "a"}])
        time.sleep(0.5)  # past the time limit
        return ctx.openai_client().chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": "b"}])
    raise AssertionError(kind)


async def mixed_async_agent(task, ctx):
    c = ctx.async_openai_client()
    await c.chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": "a"}])
    if task["kind"] == "async-raise":
        raise RuntimeError("async agent bug")
    return "done"


def stage_leaks(args: argparse.Namespace, *, episodes: int = 200, envs: int = 16) -> None:
    kinds = ["ok", "raise", "too-many-turns", "bad-request", "own-client", "raw-httpx", "slow", "async-ok", "async-raise"]

    def make_env(kind: str) -> AgentEnv:
        agent = mixed_async_agent if kind.startswith("async") else mixed_agent
        return AgentEnv(agent, [{"kind": kind}], transport="http", max_turns=3, time_limit=0.4, stop_grace=0.5)

    def run_episode(env: AgentEnv) -> str:
        obs, info = env.reset(seed=0)
        if info.get("episode_over"):
            return info["status"]
        while True:
            *_, term, trunc, info = env.step("x")
            if term or trunc:
                return info["status"]

    # Envs are kept for the whole run, as a trainer keeps them. The baseline: the server and the
    # agents' loop started, no episode run yet.
    gw = get_gateway()
    gw.start()
    gw.background_loop()
    before = _snapshot()
    names_before = {t.name for t in threading.enumerate()}
    pool = [make_env(kinds[i % len(kinds)]) for i in range(envs)]
    statuses: dict[str, int] = {}
    lock = threading.Lock()

    def worker(env: AgentEnv, n: int) -> None:
        for _ in range(n):
            status = run_episode(env)
            with lock:
                statuses[status] = statuses.get(status, 0) + 1

    workers = [threading.Thread(target=worker, args=(e, episodes // envs + (i < episodes % envs))) for i, e in enumerate(pool)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    time.sleep(2.0)
    after = _snapshot()
    left = sorted(t.name for t in threading.enumerate() if t.name not in names_before)
    print(
        f"{episodes} mixed-fault HTTP episodes {statuses}: threads {before[0]} -> {after[0]} (+{after[0] - before[0]}), "
        f"fds {before[1]} -> {after[1]} (+{after[1] - before[1]}), sockets {before[2]} -> {after[2]} (+{after[2] - before[2]}); "
        f"new threads: {left}"
    )


def stage_sleepers(args: argparse.Namespace, *, count: int = 20, sleep: float = 30.0) -> None:
    def agent(task, ctx):
        ctx.chat_completion([{"role": "user", "content": "x"}])
        time.sleep(sleep)  # a C call: nothing in CPython can interrupt it in a non-main thread

    gw = get_gateway()
    before = _snapshot()
    envs = [AgentEnv(agent, [{}], stop_grace=0.2) for _ in range(count)]
    for e in envs:
        e.reset(seed=0)
    t0 = time.monotonic()
    for e in envs:
        e.step_async("go")  # the agents now sleep
    time.sleep(0.2)
    for e in envs:
        e.close()
    time.sleep(2.0)
    left = _snapshot()[0] - before[0]
    lingering = getattr(gw, "lingering_agents", None)
    reported = len(lingering()) if lingering else "n/a"
    noted = sum("did not stop" in (e.trajectory.error or "") for e in envs)
    time.sleep(max(0.0, sleep + 1.0 - (time.monotonic() - t0)))
    print(
        f"{count} agents blocked in time.sleep({sleep:.0f}) after close(): {left} threads left after 2 s, "
        f"{reported} reported by gateway.lingering_agents(), {noted} trajectories say so; "
        f"{_snapshot()[0] - before[0]} threads left once the sleep returned"
    )


class _SlowFinalizer:
    """Its ``__del__`` runs Python code for 5 ms: an exception raised there is only printed."""

    def __del__(self) -> None:
        end = time.monotonic() + 0.005
        while time.monotonic() < end:
            pass


def swallowing_agent(task, ctx):
    """Swallows ``Exception`` and calls again, forever. With ``task["finalizer"]`` it spends half
    its time in a ``__del__``, where a raised AgentCancelled is lost (as it is, rarely, in the
    weakref callbacks the openai client triggers)."""
    import openai

    own = task.get("own_client")  # its own client over HTTP: no call boundary of ours to raise at
    client = openai.OpenAI(base_url=ctx.base_url, api_key=ctx.api_key, max_retries=0) if own else ctx.openai_client()
    while True:
        try:
            if task.get("finalizer"):
                _SlowFinalizer()  # collected at once: its __del__ runs here
                end = time.monotonic() + 0.005
                while time.monotonic() < end:
                    pass
            client.chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": "x"}])
        except Exception:  # noqa: BLE001, S112 - the hostile agent under test
            pass


def stage_swallow(args: argparse.Namespace, *, count: int = 50, batch: int = 10) -> None:
    get_gateway()
    variants = [
        ("plain, in-process", {}, "inproc"),
        ("half their time in a __del__, in-process", {"finalizer": True}, "inproc"),
        ("half their time in a __del__, own openai client over HTTP", {"finalizer": True, "own_client": True}, "http"),
    ]
    for kind, task, transport in variants:
        survivors = 0
        for _ in range(0, count, batch):
            envs = [AgentEnv(swallowing_agent, [task], stop_grace=1.0, transport=transport) for _ in range(batch)]
            for env in envs:
                env.reset(seed=0)
                env.step_async("once")
            threads = [env._worker._thread for env in envs]  # noqa: SLF001 - what we measure
            closers = [threading.Thread(target=env.close) for env in envs]
            for c in closers:
                c.start()
            for c in closers:
                c.join()
            time.sleep(1.0)
            survivors += sum(t.is_alive() for t in threads)
        print(f"{count} agents that swallow Exception and keep calling ({kind}): {survivors} still running 1 s after close()")


def stage_chunked(args: argparse.Namespace) -> None:
    stage_bodies(args, chunked=True)


USER = {"role": "user", "content": "hi"}

# Issue 11, item 6: (route, body) pairs that used to get plain-text 500s, record a step, or stream.
ERROR_CASES = {
    "invalid UTF-8": ("chat", b'{"messages": [{"role": "user", "content": "\xff"}]}'),
    "100k-deep nesting": ("chat", b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    "stream_options 'x'": ("chat", json.dumps({"messages": [USER], "stream": True, "stream_options": "x"}).encode()),
    "stream 'no'": ("chat", json.dumps({"messages": [USER], "stream": "no"}).encode()),
    "variables {'': 1}": ("variables", b'{"": 1}'),
    "variables deep nesting": ("variables", b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    "reward NaN": ("rewards", b'{"value": NaN}'),
}

# Issue 11, item 3: what the hf backend rejects, and the gateway used to accept.
POISONS = {
    "top_p NaN": b'{"messages": [{"role": "user", "content": "hi"}], "top_p": NaN}',
    "seed 2**80": json.dumps({"messages": [USER], "seed": 2**80}).encode(),
    "image part": json.dumps(
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}
    ).encode(),
    "tool_calls not objects": json.dumps({"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [1]}]}).encode(),
    "unknown role": json.dumps({"messages": [{"role": "robot", "content": "x"}]}).encode(),
    "content a number": json.dumps({"messages": [{"role": "user", "content": 5}]}).encode(),
}


def stage_errors(args: argparse.Namespace) -> None:
    import httpx

    def agent(task, ctx):
        out = {}
        ep = ctx.base_url.rsplit("/v1", 1)[0]
        with httpx.Client(timeout=10) as http:
            for name, (route, body) in ERROR_CASES.items():
                url = f"{ctx.base_url}/chat/completions" if route == "chat" else f"{ep}/{route}"
                try:
                    r = http.post(url, content=body, headers={"content-type": "application/json"})
                    try:
                        shaped = "error" in r.json()
                    except ValueError:
                        shaped = False
                    kind = r.headers.get("content-type", "").split(";")[0]
                    out[name] = f"{r.status_code} {kind}{' (OpenAI error)' if shaped else ''}"
                except httpx.HTTPError as exc:
                    out[name] = type(exc).__name__
        return out

    env = AgentEnv(agent, [{}], transport="http", time_limit=60)
    obs, info = env.reset(seed=0)
    done = info.get("episode_over", False)
    while not done:  # answer whatever the gateway let through as a call
        *_, term, trunc, info = env.step("answer")
        done = term or trunc
    traj = env.trajectory
    for name, result in traj.result.items():
        print(f"  {name:24s} {result}")
    print(f"steps recorded: {len(traj.steps)}; rewards {len(traj.rewards)}; variables {sorted(traj.variables)}; status {traj.status}")


def stage_poison(args: argparse.Namespace, *, episodes: int = 8) -> None:
    import httpx

    from agentgym_lightning.policies.hf import HFPolicy
    from agentgym_lightning.policies.models import resolve_model
    from agentgym_lightning.rollouts.in_process import rollout

    hf = HFPolicy(str(resolve_model("smollm2-135m")), device="cpu", default_max_tokens=2, num_threads=1)
    batches: list[int] = []
    failed: list[int] = []

    def policy(requests):
        batches.append(len(requests))
        try:
            return hf.generate(requests)
        except Exception:
            failed.append(len(requests))
            raise

    def agent(task, ctx):
        codes = []
        if task["culprit"]:
            with httpx.Client(timeout=60) as http:
                for body in POISONS.values():
                    codes.append(http.post(f"{ctx.base_url}/chat/completions", content=body).status_code)
        ctx.chat_completion([{"role": "user", "content": f"Say {task['i']}."}], max_tokens=2, temperature=0)
        return codes

    tasks = [{"i": i, "culprit": i == 3} for i in range(episodes)]
    make = lambda: AgentEnv(agent, tasks, transport="http", time_limit=120)  # noqa: E731
    statuses: dict[str, int] = {}
    culprit = None
    try:
        out = rollout(make, policy, episodes=episodes, concurrency=episodes, progress=False)
    except Exception as exc:  # noqa: BLE001 - the figure we report
        print(f"rollout raised {type(exc).__name__}: {str(exc)[:160]}")
        out = []
    for t in out:
        status = getattr(t.status, "value", str(t.status))
        statuses[status] = statuses.get(status, 0) + 1
        if t.task["culprit"]:
            culprit = t
    innocent = sum(getattr(t.status, "value", "") != "succeeded" for t in out if not t.task["culprit"])
    print(
        f"{episodes} episodes on hf, one sending {len(POISONS)} poisons: statuses {statuses}, innocent episodes failed "
        f"{innocent}; culprit answers {culprit.result if culprit else None}, culprit steps "
        f"{len(culprit.steps) if culprit else None}; generate calls {len(batches)} (requests {sum(batches)}), "
        f"of which raised {len(failed)}"
    )
    hf.close()


# ------------------------------------------------------------- issue 37 items 12-14: work, not bytes

POSTER = r"""
import json, socket, sys, time
host, port, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
for line in sys.stdin:
    name, path, media, body_file = json.loads(line)
    body = open(body_file, "rb").read()
    head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {media}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    start = time.perf_counter()
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        sock.sendall(head.encode() + body)
    except OSError:
        pass  # refused while sending: read the answer, as httpx does
    data, status = b"", None
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except OSError as exc:
        status = type(exc).__name__
    sock.close()
    answer = data.split(b"\r\n\r\n", 1)[-1]
    status = status or (data.split(b" ", 2)[1].decode() if data else "closed without an answer")
    print(json.dumps([name, len(body), status, round(time.perf_counter() - start, 3), answer[:160].decode(errors="replace")]), flush=True)
"""


class _Innocents:
    """``count`` agents calling the gateway over HTTP in a loop, answered at once by a driver:
    their calls' latencies and failures while the hostile requests run."""

    def __init__(self, count: int = 4) -> None:
        from agentgym_lightning.llm import Completion
        from agentgym_lightning.rollouts.in_process import rollout

        self.stop = threading.Event()
        self.latencies: list[float] = []
        self.failures: list[str] = []

        def agent(task, ctx):
            client = ctx.openai_client()
            while not self.stop.is_set():
                start = time.perf_counter()
                try:
                    client.chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": "hi"}])
                    self.latencies.append(time.perf_counter() - start)
                except Exception as exc:  # noqa: BLE001 - the figure we report
                    self.failures.append(type(exc).__name__)
                time.sleep(0.01)

        make = lambda: AgentEnv(agent, [{}], transport="http", time_limit=3600)  # noqa: E731
        policy = lambda requests: [Completion(text="ok") for _ in requests]  # noqa: E731
        self.thread = threading.Thread(
            target=rollout, args=(make, policy), kwargs={"episodes": count, "concurrency": count, "progress": False},
            daemon=True,
        )
        self.thread.start()

    def take(self) -> str:
        latencies, self.latencies = sorted(self.latencies), []
        failures, self.failures = self.failures, []
        if not latencies:
            return f"innocent calls: none answered, {len(failures)} failed"
        p50, worst = latencies[len(latencies) // 2], latencies[-1]
        return f"innocent calls: {len(latencies)} answered (median {p50 * 1000:.0f} ms, worst {worst * 1000:.0f} ms), {len(failures)} failed"


def _peak_rss_sampler() -> tuple[threading.Event, list[float]]:
    """The serving process's RSS, sampled every 10 ms until the event is set: [peak MB]."""
    stop, peak = threading.Event(), [PROC.memory_info().rss / 2**20]

    def sample() -> None:
        while not stop.wait(0.01):
            peak[0] = max(peak[0], PROC.memory_info().rss / 2**20)

    threading.Thread(target=sample, daemon=True).start()
    return stop, peak


def _run_hostile(args: argparse.Namespace, payloads: dict[str, tuple[str, str, bytes]], innocents: int = 4) -> None:
    """Post each payload (``route under the episode``, media type, body) from a child process,
    one at a time, while ``innocents`` agents call the gateway; per payload: the answer, its
    time, the serving process's peak RSS growth and how the innocent calls fared meanwhile."""
    only = set(args.only.split(";")) if args.only else set(payloads)
    gw = get_gateway()
    gw.start()
    env, release, t = _blocked_episode(hold=3600.0)
    crowd = _Innocents(innocents)
    time.sleep(2.0)
    print(f"before: {crowd.take()}")
    with tempfile.TemporaryDirectory() as tmp:
        child = subprocess.Popen(
            [sys.executable, "-c", POSTER, gw.host, str(gw.port), str(args.timeout)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert child.stdin is not None and child.stdout is not None
        for name, (route, media, body) in payloads.items():
            if name not in only:
                continue
            body_file = Path(tmp) / "body"
            body_file.write_bytes(body)
            gc.collect()
            base = PROC.memory_info().rss / 2**20
            stop, peak = _peak_rss_sampler()
            child.stdin.write(json.dumps([name, f"/episodes/{env.episode_id}/{route}", media, str(body_file)]) + "\n")
            child.stdin.flush()
            _, size, status, seconds, answer = json.loads(child.stdout.readline())
            time.sleep(0.5)  # innocent calls after the answer too
            stop.set()
            print(f"{name} ({size / 2**10:,.0f} KiB): {status} in {seconds:.3f} s, peak RSS +{peak[0] - base:,.0f} MB; {crowd.take()}")
            print(f"    {answer[:150]}")
        child.stdin.close()
        child.wait(30)
    print(f"steps recorded by the hostile requests' episode: {len(env.trajectory.steps)}")
    crowd.stop.set()
    release.set()


def otlp_request(spans: int = 1, attribute: Any = None) -> Any:
    """An ``ExportTraceServiceRequest`` of ``spans`` spans, each with ``attribute`` (if given) as ``a``."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import KeyValue

    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    for i in range(spans):
        span = scope.spans.add(trace_id=b"\1" * 16, span_id=(i + 1).to_bytes(8, "big"), name="s")
        if attribute is not None:
            span.attributes.append(KeyValue(key="a", value=attribute))
    return request


def nested_kvlist(levels: int) -> Any:
    """An OTLP ``AnyValue`` holding ``levels`` key-value lists in one another (issue 37 item 13:
    each level used to be JSON text re-escaped by the next, doubling its size); the tests use it too."""
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    value = AnyValue(string_value='"\\')
    for _ in range(levels):
        outer = AnyValue()
        outer.kvlist_value.values.append(KeyValue(key="k", value=value))
        value = outer
    return value


def stage_work(args: argparse.Namespace) -> None:
    chat_item = json.dumps(USER).encode()
    payloads = {
        "10,000 empty Responses items": ("v1/responses", "application/json", json.dumps({"input": [{}] * 10_000}).encode()),
        "10,000 function_call items, call_id 1": (
            "v1/responses", "application/json",
            json.dumps({"input": [{"type": "function_call", "call_id": 1}] * 10_000}).encode(),
        ),
        "100,000 empty chat tools": (
            "v1/chat/completions", "application/json", json.dumps({"messages": [USER], "tools": [{}] * 100_000}).encode()
        ),
        "100,000 bad metadata values on chat": (
            "v1/chat/completions", "application/json",
            json.dumps({"messages": [USER], "metadata": {str(i): i for i in range(100_000)}}).encode(),
        ),
        "8 MB of ~2.8M empty Responses items": (
            "v1/responses", "application/json", b'{"input": [' + b",".join([b"{}"] * 2_790_000) + b"]}"
        ),
        "8 MB of 240k valid chat messages": (
            "v1/chat/completions", "application/json", b'{"messages": [' + b",".join([chat_item] * 240_000) + b"]}"
        ),
        "8 MB of 143k OTLP spans (protobuf)": (
            "v1/traces", "application/x-protobuf", otlp_request(spans=143_000).SerializeToString()
        ),
    }
    _run_hostile(args, payloads)


def stage_otlp(args: argparse.Namespace) -> None:
    from agentgym_lightning.gateway.otlp import otlp_json

    payloads = {
        f"kvlist {levels} levels deep (protobuf)": (
            "v1/traces", "application/x-protobuf", otlp_request(attribute=nested_kvlist(levels)).SerializeToString()
        )
        for levels in (27, 30)
    }
    # 30 key-value lists in one another: 120 levels of JSON.
    payloads["kvlist 120 JSON levels deep (OTLP/JSON)"] = (
        "v1/traces", "application/json", otlp_json(otlp_request(attribute=nested_kvlist(30)))
    )
    _run_hostile(args, payloads)


def stage_answers(args: argparse.Namespace) -> None:
    """Item 14: the requests that were 500s, and the answers a policy writes that were."""
    import httpx

    from agentgym_lightning.llm import Completion

    uses = [{"type": "tool_use", "id": bad, "name": "f", "input": {}} for bad in (["a"], {"a": 1})]
    payloads = {
        f"Anthropic tool_use.id as a {type(use['id']).__name__}": (
            "v1/messages", "application/json",
            json.dumps({"max_tokens": 5, "messages": [USER, {"role": "assistant", "content": [use]}, USER]}).encode(),
        )
        for use in uses
    }
    payloads["9 MB on /v1/messages"] = ("v1/messages", "application/json", b" " * (9 * 2**20))
    _run_hostile(args, payloads, innocents=1)

    # A policy's own answers: tool-call arguments past the decoder's recursion limit, NaN, 1e999.
    answers = {
        "arguments 5,000 levels deep": '{"a": ' + "[" * 5_000 + "]" * 5_000 + "}",
        "arguments with NaN": '{"a": NaN}',
        "arguments with 1e999": '{"a": 1e999}',
    }

    def agent(task, ctx):
        out = []
        with httpx.Client(timeout=60) as http:
            for _ in answers:
                r = http.post(f"{ctx.anthropic_base_url}/v1/messages", json={"max_tokens": 5, "messages": [USER]})
                try:
                    json.loads(r.content, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
                    strict = "strict JSON"
                except ValueError as exc:
                    strict = f"not JSON ({str(exc)[:40]})"
                out.append(f"{r.status_code}, {strict}")
        return out

    env = AgentEnv(agent, [{}], transport="http", time_limit=120)
    env.reset(seed=0)
    for args_text in answers.values():
        *_, info = env.step(Completion(text="", tool_calls=[{"id": "c", "name": "f", "arguments": args_text}]))
    for name, seen in zip(answers, info["trajectory"].result or ()):
        print(f"answer with {name}: the Anthropic agent got {seen}")

    _forged_span()
    _billion_tokens(args)  # last: a revision without the cap may not finish it


def _billion_tokens(args: argparse.Namespace, cap: int = 256) -> None:
    """A 4-token call batched beside one asking for a billion tokens, on the hf backend, through
    a gateway capping each call at ``cap`` tokens (a revision without the cap: its defaults)."""
    import dataclasses

    import httpx

    from agentgym_lightning.gateway import Gateway
    from agentgym_lightning.gateway.limits import GatewayLimits
    from agentgym_lightning.policies.hf import HFPolicy
    from agentgym_lightning.policies.models import resolve_model
    from agentgym_lightning.rollouts.in_process import rollout

    hf = HFPolicy(str(resolve_model("smollm2-135m")), device="cpu", num_threads=1)
    answered: dict[str, float] = {}
    start = time.perf_counter()

    def agent(task, ctx):
        with httpx.Client(timeout=args.timeout) as http:
            body = {"prompt": "Count: 1, 2, 3,", "max_tokens": task["max_tokens"], "temperature": 0}
            try:
                r = http.post(f"{ctx.base_url}/completions", json=body).json()
                answered[task["name"]] = time.perf_counter() - start
                return r["choices"][0]["finish_reason"], r["usage"]["completion_tokens"]
            except httpx.HTTPError as exc:
                return type(exc).__name__

    try:
        gateway = Gateway(limits=dataclasses.replace(GatewayLimits(), max_completion_tokens=cap))
        print(f"a 4-token and a 1e9-token call on hf, the gateway's max_completion_tokens {cap}:")
    except TypeError:
        gateway = Gateway()
        print("a 4-token and a 1e9-token call on hf (this revision has no max_completion_tokens):")
    tasks = [{"name": "4 tokens", "max_tokens": 4}, {"name": "1e9 tokens", "max_tokens": 1_000_000_000}]
    make = lambda: AgentEnv(agent, tasks, transport="http", time_limit=args.timeout + 30, gateway=gateway)  # noqa: E731
    out = rollout(make, hf, episodes=2, concurrency=2, progress=False, max_batch_wait=1.0)
    for t in out:
        seen = t.steps[0].request.sampling.max_tokens if t.steps else None
        print(
            f"{t.task['name']}: answered after {answered.get(t.task['name'], float('nan')):.1f} s "
            f"(finish_reason, completion_tokens) {t.result}; the policy was asked for {seen}"
        )
    hf.close()
    gateway.close()


def _forged_span() -> None:
    """An in-process agent starting a failing tool span in a context carrying another episode's
    trace id: does the victim episode record it (and its AIR signal)?"""
    from opentelemetry import trace

    from agentgym_lightning.tracing.spans import episode_trace_id

    victim_ready, forged = threading.Event(), threading.Event()

    def victim(task, ctx):
        victim_ready.set()
        forged.wait(30)
        return ctx.chat_completion([USER]).text

    victim_env = AgentEnv(victim, [{}], lambda t, r: 1.0, air_weights={"otel.tool_error": -0.5})
    holder: dict = {}
    t = threading.Thread(target=lambda: holder.setdefault("reset", victim_env.reset(seed=0)))
    t.start()
    victim_ready.wait(10)

    def attacker(task, ctx):
        parent = trace.NonRecordingSpan(trace.SpanContext(
            trace_id=episode_trace_id(task), span_id=0xBAD, is_remote=False,
            trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED)))
        with trace.get_tracer("attacker").start_as_current_span(
            "execute_tool calculator", context=trace.set_span_in_context(parent),
            attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "calculator"},
        ) as span:
            span.set_status(trace.Status(trace.StatusCode.ERROR, "forged"))

    attacker_env = AgentEnv(attacker, [victim_env.episode_id], lambda t, r: 0.0)
    attacker_env.reset(seed=0)
    forged.set()
    t.join(10)
    *_, info = victim_env.step("answer")
    trajectory = info["trajectory"]
    print(
        f"forged in-process span: the victim episode recorded {len(trajectory.spans)} spans, "
        f"AIR rewards {[(r.source, r.value) for s in trajectory.steps for r in s.rewards]}, total reward "
        f"{trajectory.total_reward}"
    )


# ------------------------------------------------------------- issue 50 item 6: slow clients, pipelining

SLOW_SENDER = r"""
import json, socket, sys, threading, time
host, port, path, count, size, seconds = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
prefix, suffix = b'{"messages": [{"role": "user", "content": "', b'"}]}'
body = prefix + b"x" * (size - len(prefix) - len(suffix)) + suffix
statuses, piece = [], 64 * 2**10

def one():
    try:
        s = socket.create_connection((host, port), timeout=120)
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode())
        pieces = range(0, len(body), piece)
        for start in pieces:
            s.sendall(body[start:start + piece])
            time.sleep(seconds / len(pieces))
    except OSError:
        pass  # refused while sending: read the answer, as httpx does
    try:
        reply = s.recv(200)
        statuses.append(reply.split(b"\r\n", 1)[0].decode(errors="replace") or "closed without an answer")
    except OSError as exc:
        statuses.append(type(exc).__name__)
    finally:
        s.close()

ts = [threading.Thread(target=one) for _ in range(count)]
for t in ts: t.start()
for t in ts: t.join()
print(json.dumps(statuses))
"""


def stage_slow(args: argparse.Namespace, *, count: int = 60, size: int = 8 * 2**20 - 2**10, seconds: float = 20.0) -> None:
    """``count`` clients each send a body just under ``max_body_bytes`` over ``seconds`` while
    four agents call the gateway: the serving process's peak RSS growth, the slow clients'
    answers, and the innocent calls' latency."""
    gw = get_gateway()
    gw.start()
    env, release, t = _blocked_episode(hold=3600.0)
    crowd = _Innocents(4)
    time.sleep(2.0)
    print(f"before: {crowd.take()}")
    gc.collect()
    base = PROC.memory_info().rss / 2**20
    stop, peak = _peak_rss_sampler()
    # An episode that does not exist: each body is read whole, then answered 404 at once, so what
    # is measured is what the bodies cost while they arrive (a running episode's call would go on
    # holding its messages while it waits for its answer, as any agent's call does).
    path = "/episodes/no-such-episode/v1/chat/completions"
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", SLOW_SENDER, gw.host, str(gw.port), path, str(count), str(size), str(seconds)],
        capture_output=True, text=True, timeout=600,
    )
    stop.set()
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    summary: dict[str, int] = {}
    for status in json.loads(out.stdout):
        summary[status] = summary.get(status, 0) + 1
    print(f"{count} x {size / 2**20:.1f} MB bodies sent over {seconds:.0f} s each ({time.perf_counter() - start:.1f} s in all): "
          f"peak RSS +{peak[0] - base:,.0f} MB; answers {summary}; {crowd.take()}")
    crowd.stop.set()
    release.set()


def stage_pipelined(args: argparse.Namespace, *, count: int = 50) -> None:
    """``count`` requests pipelined on one connection (sent at once, before any answer): to
    ``/health``, to a running episode's base URL, and to an ended one's."""
    from agentgym_lightning.llm import Completion
    from agentgym_lightning.rollouts.in_process import rollout

    gw = get_gateway()
    gw.start()

    def exchange(data: bytes) -> bytes:
        sock = socket.create_connection((gw.host, gw.port), timeout=5)
        sock.sendall(data)
        out = b""
        try:
            while chunk := sock.recv(65536):
                out += chunk
        except OSError:
            pass  # kept alive: the keep-alive timeout would close it
        sock.close()
        return out

    def report(name: str, out: bytes) -> None:
        statuses = [m.decode() for m in re.findall(rb"HTTP/1\.1 (\d{3}) ", out)]  # a body has no line end
        summary: dict[str, int] = {}
        for status in statuses:
            summary[status] = summary.get(status, 0) + 1
        print(f"{name}: {len(statuses)} answers of {count} {summary}")

    report("GET /health", exchange(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" * count))
    chat = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    seen: dict[str, bytes] = {}

    def agent(task, ctx):
        request = (f"POST /episodes/{ctx.episode_id}/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(chat)}\r\n\r\n").encode() + chat
        seen["request"] = request
        seen["running"] = exchange(request * count)
        return "done"

    make = lambda: AgentEnv(agent, [{}], transport="http", time_limit=120)  # noqa: E731
    rollout(make, lambda requests: [Completion(text="ok") for _ in requests], episodes=1, progress=False)
    report("chat calls to a running episode", seen["running"])
    report("chat calls to an ended episode", exchange(seen["request"] * count))


STAGES = {
    "work": stage_work,
    "otlp": stage_otlp,
    "answers": stage_answers,
    "bodies": stage_bodies,
    "chunked": stage_chunked,
    "headers": stage_headers,
    "idle": stage_idle,
    "emfile": stage_emfile,
    "leaks": stage_leaks,
    "sleepers": stage_sleepers,
    "swallow": stage_swallow,
    "errors": stage_errors,
    "poison": stage_poison,
    "slow": stage_slow,
    "pipelined": stage_pipelined,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=sorted(STAGES))
    parser.add_argument("--only", default="", help="work/otlp/answers: only these payloads (names, separated by ;)")
    parser.add_argument("--timeout", type=float, default=300.0, help="work/otlp/answers: seconds per hostile request")
    args = parser.parse_args()
    STAGES[args.stage](args)
    os._exit(0)  # leftover agent threads (the figure some stages report) must not hold the exit


if __name__ == "__main__":
    main()
