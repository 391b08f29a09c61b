"""The env's own overhead per step, with an instant scripted policy (generation costs nothing).

Measured in one run and printed as numbers and ratios:

1. In-process, per step (driver's view of ``env.step``): the native path (``ctx.chat_completion``)
   and an httpx agent through the in-process transport. For the httpx agent the client's own cost
   (the same client against a transport that answers instantly, measured here too) is subtracted,
   so what remains is ours.
2. Over HTTP: added per call versus in-process at p50, and the gateway server thread's CPU time
   per call (read from /proc for the uvicorn thread).
3. Aggregate steps/s with 1, 16 and 256 concurrent episodes through the batched driver, with the
   agents' own per-call latency p50/p99 (``bench/bench_driver.py`` compares the driver's modes).
4. CPU per call along one long episode (10,000 calls, completions with token ids so the
   chat-template continuity check runs): it must stay flat from the 100th call to the 10,000th.

Targets on a 2-core machine: in-process p50 <= 0.5 ms; HTTP <= 1 ms added at p50 and <= 0.8 ms
gateway CPU per call; 256 episodes >= 90 % of single-episode throughput with p99 <= 10x p50.

    python bench/bench_env_overhead.py [--steps 3000] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time

import httpx

from agentgym_lightning import Completion
from agentgym_lightning.env import AgentEnv
from agentgym_lightning.gateway import get_gateway
from agentgym_lightning.rollouts.in_process import rollout

BODY = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "hi"}]}).encode()
HEADERS = {"content-type": "application/json"}
ANSWER = Completion(text="ok")


def native_agent(task, ctx):
    for i in range(task["calls"]):
        t = time.perf_counter()
        ctx.chat_completion([{"role": "user", "content": "hi"}])
        # The first call of an episode also waits for every other episode to start.
        (task["latencies"] if i else task.setdefault("first", [])).append(time.perf_counter() - t)


def httpx_agent(task, ctx):
    http = ctx.http_client()
    url = ctx.base_url_for_clients + "/chat/completions"
    for i in range(task["calls"]):
        t = time.perf_counter()
        http.post(url, content=BODY, headers=HEADERS).json()
        (task["latencies"] if i else task.setdefault("first", [])).append(time.perf_counter() - t)


async def async_native_agent(task, ctx):
    for i in range(task["calls"]):
        t = time.perf_counter()
        await ctx.achat_completion([{"role": "user", "content": "hi"}])
        (task["latencies"] if i else task.setdefault("first", [])).append(time.perf_counter() - t)


async def async_httpx_agent(task, ctx):
    """The HTTP agents of the throughput runs: one event loop, not one thread per agent."""
    async with ctx.async_http_client() as http:
        url = ctx.base_url_for_clients + "/chat/completions"
        for i in range(task["calls"]):
            t = time.perf_counter()
            (await http.post(url, content=BODY, headers=HEADERS)).json()
            (task["latencies"] if i else task.setdefault("first", [])).append(time.perf_counter() - t)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def step_latencies(agent, transport: str, steps: int) -> tuple[list[float], float]:
    """Driver-side latency of each ``env.step`` and CPU seconds per step (whole process)."""
    env = AgentEnv(agent, [{"calls": steps + 1, "latencies": []}], transport=transport, time_limit=None)
    env.reset(seed=0)
    for _ in range(50):  # warm-up
        env.step(ANSWER)
    lat = []
    cpu0 = time.process_time()
    for _ in range(steps - 50):
        t = time.perf_counter()
        env.step(ANSWER)
        lat.append(time.perf_counter() - t)
    cpu = (time.process_time() - cpu0) / len(lat)
    env.close()
    return lat, cpu


def client_cost(steps: int) -> float:
    """p50 of the bare httpx client posting to a transport that answers instantly."""
    reply = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}).encode()

    class Instant(httpx.BaseTransport):
        def handle_request(self, request):
            request.read()
            return httpx.Response(200, content=reply, headers=HEADERS)

    http = httpx.Client(transport=Instant())
    lat = []
    for _ in range(steps):
        t = time.perf_counter()
        http.post("http://x/v1/chat/completions", content=BODY, headers=HEADERS).json()
        lat.append(time.perf_counter() - t)
    return statistics.median(lat[50:])


def thread_cpu_seconds(native_id: int) -> float:
    with open(f"/proc/self/task/{native_id}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def gateway_cpu_per_call(steps: int) -> float:
    gw = get_gateway()
    gw.start()
    server_thread = next(t for t in threading.enumerate() if t.name == "agentgym-gateway")
    env = AgentEnv(httpx_agent, [{"calls": steps + 1, "latencies": []}], transport="http", time_limit=None)
    env.reset(seed=0)
    for _ in range(50):
        env.step(ANSWER)
    before = thread_cpu_seconds(server_thread.native_id)
    n = steps - 50
    for _ in range(n):
        env.step(ANSWER)
    after = thread_cpu_seconds(server_thread.native_id)
    env.close()
    return (after - before) / n


def throughput(concurrency: int, calls: int, transport: str, agent) -> tuple[float, float, float, float]:
    """Aggregate steps/s, the agents' call latency p50/p99 after their first call, and the
    slowest first call (episode start-up) with ``concurrency`` episodes."""
    task: dict = {"calls": calls, "latencies": [], "first": []}

    def factory() -> AgentEnv:
        # Tasks are shared by reference on purpose: every agent appends to the same lists.
        return AgentEnv(agent, [task], transport=transport, time_limit=None)

    t = time.perf_counter()
    trajs = rollout(factory, lambda reqs: [ANSWER] * len(reqs), episodes=concurrency, concurrency=concurrency, progress=False)
    elapsed = time.perf_counter() - t
    steps = sum(len(tr.steps) for tr in trajs)
    lat = task["latencies"]
    return steps / elapsed, pct(lat, 0.5), pct(lat, 0.99), max(task["first"])


def long_episode_cpu(steps: int, block: int = 1_000) -> dict[int, float]:
    """Process CPU seconds per step over each ``block`` of steps of one ``steps``-call episode
    (keyed by the block's last step). Blocks, not single steps: a garbage collection lands in
    one block and is amortized over it, as it is in a run."""
    env = AgentEnv(native_agent, [{"calls": steps + 1, "latencies": []}], time_limit=None)
    env.reset(seed=0)
    answer = Completion(text="ok", prompt_token_ids=[1, 2, 3], completion_token_ids=[4])
    out: dict[int, float] = {}
    cpu0 = time.process_time()
    for i in range(1, steps + 1):
        env.step(answer)
        if i % block == 0 or i == 100:
            now = time.process_time()
            out[i] = (now - cpu0) / (100 if i == 100 else block - 100 if i == block else block)
            cpu0 = now
    env.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--quick", action="store_true", help="fewer steps (smoke run)")
    args = ap.parse_args()
    steps = 400 if args.quick else args.steps
    ms = 1e3

    print(f"== per-step overhead, {steps} steps, instant policy")
    nat, nat_cpu = step_latencies(native_agent, "inproc", steps)
    print(f"in-process native    p50 {pct(nat, .5)*ms:.3f} ms  p99 {pct(nat, .99)*ms:.3f} ms  CPU/step {nat_cpu*ms:.3f} ms")
    inp, inp_cpu = step_latencies(httpx_agent, "inproc", steps)
    cost = client_cost(steps)
    print(
        f"in-process httpx     p50 {pct(inp, .5)*ms:.3f} ms  p99 {pct(inp, .99)*ms:.3f} ms  CPU/step {inp_cpu*ms:.3f} ms"
        f"  (httpx client alone p50 {cost*ms:.3f} ms -> env overhead p50 {(pct(inp, .5)-cost)*ms:.3f} ms)"
    )
    http, http_cpu = step_latencies(httpx_agent, "http", steps)
    added = pct(http, 0.5) - pct(inp, 0.5)
    print(f"HTTP (socket)        p50 {pct(http, .5)*ms:.3f} ms  p99 {pct(http, .99)*ms:.3f} ms  CPU/step {http_cpu*ms:.3f} ms")
    print(f"HTTP added per call at p50 vs in-process: {added*ms:.3f} ms (target <= 1 ms)")
    gw_cpu = gateway_cpu_per_call(steps)
    print(f"gateway server CPU per call: {gw_cpu*ms:.3f} ms -> {1/gw_cpu if gw_cpu else float('inf'):.0f} calls/s on one core (target <= 0.8 ms)")

    n = 2_000 if args.quick else 10_000
    per = long_episode_cpu(n)
    blocks = [per[k] for k in sorted(per) if k != 100]
    first, last = statistics.median(blocks[:3]), statistics.median(blocks[-3:])
    print(f"== CPU per call along one {n:,}-call episode (token ids on every completion)")
    print(f"calls 1-100: {per[100] * ms:.3f} ms; per block of 1,000 calls: " + " ".join(f"{b * ms:.3f}" for b in blocks) + " ms")
    print(f"median of the last 3 blocks / the first 3: {last / first:.2f} (flat = ~1; a block with a full GC runs higher)")

    calls = 20 if args.quick else 60
    modes = (
        ("inproc", "sync agents, one thread each", native_agent),
        ("inproc", "async agents on one loop", async_native_agent),
        ("http", "async agents on one loop", async_httpx_agent),
    )
    for transport, kind, agent in modes:
        print(f"== aggregate throughput, batched driver, {transport} ({kind}), {calls} calls per episode")
        base = None
        for c in (1, 16, 256):
            sps, p50, p99, first = throughput(c, calls, transport, agent)
            base = base or sps
            print(
                f"{c:>4} episodes: {sps:8.0f} steps/s  ratio to 1 episode {sps/base:5.2f}  "
                f"call latency p50 {p50*ms:7.2f} ms p99 {p99*ms:7.2f} ms  p99/p50 {p99/p50:5.1f}  "
                f"slowest first call (start-up) {first*ms:7.1f} ms"
            )


if __name__ == "__main__":
    main()
