"""The batched driver: lock-step rounds (``max_batch_wait=None``, the old behaviour) against
continuous batching (the default), measured in one run and printed as ratios.

1. Head-of-line blocking: 7 healthy episodes beside 1 agent that hangs after its first call
   (``time_limit`` 10 s): when did the last healthy one finish?
2. 256 async agents over HTTP with an instant policy: steps/s; how long each call sat in the
   gateway waiting for the driver (``answered_at - requested_at``: with an instant policy all of
   it is the driver's batching); and how busy the gateway server thread was (CPU seconds / wall
   seconds). With lock-step rounds every call waits for the slowest agent of its round, and the
   gateway idles at the end of every round while the last calls trickle in.

    python bench/bench_driver.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

from agentgym_lightning import Completion
from agentgym_lightning.env import AgentEnv
from agentgym_lightning.gateway import get_gateway
from agentgym_lightning.rollouts.in_process import rollout

BODY = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "hi"}]}).encode()
HEADERS = {"content-type": "application/json"}
ANSWER = Completion(text="ok")


def instant(requests):
    return [ANSWER] * len(requests)


def maybe_hung_agent(task, ctx):
    for _ in range(task["calls"]):
        ctx.chat_completion([{"role": "user", "content": "hi"}])
        if task.get("hang"):
            while not ctx.cancelled.is_set():  # a tool that never returns
                time.sleep(0.01)


async def async_httpx_agent(task, ctx):
    async with ctx.async_http_client() as http:
        url = ctx.base_url_for_clients + "/chat/completions"
        for _ in range(task["calls"]):
            (await http.post(url, content=BODY, headers=HEADERS)).json()


def thread_cpu_seconds(native_id: int) -> float:
    with open(f"/proc/self/task/{native_id}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def head_of_line(max_batch_wait: float | None) -> tuple[float, float]:
    """Seconds until the last healthy episode finished, and until the hung one was cut."""
    tasks = [{"calls": 3, "hang": True}] + [{"calls": 3} for _ in range(7)]
    start = time.perf_counter()
    done: dict[bool, float] = {}

    def finished(trajectory) -> None:
        done[bool(trajectory.task.get("hang"))] = time.perf_counter() - start

    rollout(
        lambda: AgentEnv(maybe_hung_agent, tasks, time_limit=10.0, stop_grace=0.5),
        instant,
        episodes=8,
        concurrency=8,
        progress=False,
        on_trajectory=finished,
        max_batch_wait=max_batch_wait,
    )
    return done[False], done[True]


def gateway_busy(concurrency: int, calls: int, max_batch_wait: float | None) -> tuple[float, float, float, float]:
    """steps/s, gateway server thread CPU share, call wait p50 and p99 (seconds)."""
    gw = get_gateway()
    gw.start()
    server = next(t for t in threading.enumerate() if t.name == "agentgym-gateway")
    task = {"calls": calls}
    g0, t0 = thread_cpu_seconds(server.native_id), time.perf_counter()
    trajs = rollout(
        lambda: AgentEnv(async_httpx_agent, [task], transport="http", time_limit=None),
        instant,
        episodes=concurrency,
        concurrency=concurrency,
        progress=False,
        max_batch_wait=max_batch_wait,
    )
    wall = time.perf_counter() - t0
    g1 = thread_cpu_seconds(server.native_id)
    steps = sum(len(t.steps) for t in trajs)
    waits = sorted(s.timings.answered_at - s.timings.requested_at for t in trajs for s in t.steps[1:])
    return steps / wall, (g1 - g0) / wall, waits[len(waits) // 2], waits[int(0.99 * len(waits))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer calls (smoke run)")
    ap.add_argument("--repeat", type=int, default=3, help="A/B pairs for the 256-agent run")
    args = ap.parse_args()
    modes = (("lock-step (max_batch_wait=None)", None), ("continuous (default 0.05 s)", 0.05))

    print("== head-of-line: 7 healthy episodes (3 calls each) beside 1 hung agent (time_limit 10 s)")
    healthy = {}
    for name, wait in modes:
        healthy[name], hung = head_of_line(wait)
        print(f"{name:32s} last healthy episode done at {healthy[name]:6.2f} s; hung one cut at {hung:6.2f} s")
    (a, b) = healthy.values()
    print(f"healthy episodes finish {a / b:.0f}x sooner with continuous batching")

    calls = 10 if args.quick else 40
    print(f"== 256 async agents over HTTP, {calls} calls each, instant policy ({args.repeat} A/B pairs)")
    results: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name, _ in modes}
    for _ in range(1 if args.quick else args.repeat):
        for name, wait in modes:
            results[name].append(gateway_busy(256, calls, wait))
    medians = {}
    for name, runs in results.items():
        sps, gw, p50, p99 = medians[name] = [sorted(r[i] for r in runs)[len(runs) // 2] for i in range(4)]
        print(
            f"{name:32s} {sps:7.0f} steps/s   a call waits for the driver p50 {p50 * 1e3:6.1f} ms p99 {p99 * 1e3:6.1f} ms"
            f"   gateway thread busy {gw:5.0%}  (medians)"
        )
    lock, cont = medians.values()
    print(
        f"continuous / lock-step: steps/s x{cont[0] / lock[0]:.2f}, call wait p50 x{cont[2] / lock[2]:.2f}, "
        f"gateway busy x{cont[1] / lock[1]:.2f}"
    )


if __name__ == "__main__":
    main()
