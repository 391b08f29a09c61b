"""Rollout throughput past one process: in-process ``rollout`` vs 1, 2 and 4 Ray workers.

    python bench/bench_scaling.py                       # 256 episodes a step, both policies
    python bench/bench_scaling.py --episodes 128 --repeat 2 --json runs/scaling.json

An episode is an agent making ``--calls`` LLM calls, each followed by ``--tool-ms`` of tool work
(half sleep, as I/O, half CPU, as parsing); a step is ``--episodes`` episodes at ``--concurrency``
at once in total. Two policies:

* **scripted**: answers instantly in the worker (the rollout machinery alone);
* **mock upstream**: the ``openai`` backend against the instant mock OpenAI server in its own
  process (the real path: HTTP to a generation service, token ids returned).

For each: episodes/s and steps/s per path, the scaling ratio against 1 worker, and the per-episode
overhead of the Ray path against in-process ((wall of 1 worker - wall in-process) / episodes).
Ray's own start-up is printed apart. Paths run interleaved, ``--repeat`` times; medians reported.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from agentgym_lightning.env import AgentEnv  # noqa: E402
from agentgym_lightning.llm import Completion  # noqa: E402
from agentgym_lightning.rollouts.in_process import rollout  # noqa: E402


def agent(task, ctx):
    text = ""
    for i in range(task["calls"]):
        text = ctx.chat_completion([{"role": "user", "content": f"{task['id']}:{i}:{text[:20]}"}], max_tokens=8).text
        time.sleep(task["tool_ms"] / 2000)  # I/O-like tool work
        deadline = time.thread_time() + task["tool_ms"] / 2000
        while time.thread_time() < deadline:  # CPU-like tool work
            pass
    return text


def make_env(calls: int, tool_ms: float) -> AgentEnv:
    tasks = [{"id": i, "calls": calls, "tool_ms": tool_ms} for i in range(64)]
    return AgentEnv(agent, tasks, lambda task, result: 1.0, seed_calls=True)


class Scripted:
    def generate(self, requests):
        return [Completion(text="ok", prompt_token_ids=[1, 2, 3], completion_token_ids=[4], logprobs=[-0.1]) for _ in requests]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--tool-ms", type=float, default=10.0)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import cloudpickle
    import ray

    from agentgym_lightning.testing.mock_openai_server import spawn_mock_server
    from agentgym_lightning.policies.openai import OpenAIPolicy
    from agentgym_lightning.rollouts.ray_workers import RayRolloutRunner, init_ray

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    env = functools.partial(make_env, args.calls, args.tool_ms)
    workers = [int(w) for w in args.workers.split(",")]
    proc, url = spawn_mock_server()
    t = time.perf_counter()
    init_ray(num_cpus=max(workers))
    print(f"ray.init: {time.perf_counter() - t:.1f} s  (cores: {os.cpu_count()})")
    policies = {
        "scripted": Scripted,
        "mock upstream": functools.partial(OpenAIPolicy, "mock", base_url=f"{url}/v1"),
    }
    results: dict[str, dict[str, float]] = {}
    try:
        for name, factory in policies.items():
            runners = {n: RayRolloutRunner(env, factory, num_workers=n) for n in workers}
            for runner in runners.values():
                runner.worker_pids()  # started before timing
            walls: dict[str, list[float]] = {"in-process": [], **{f"{n} workers": [] for n in workers}}
            local_policy = factory()
            for rep in range(args.repeat):
                kw = dict(episodes=args.episodes, group_size=4, concurrency=args.concurrency, seed=rep)
                t = time.perf_counter()
                out = rollout(env, local_policy, progress=False, **kw)
                walls["in-process"].append(time.perf_counter() - t)
                assert len(out) == args.episodes
                for n, runner in runners.items():
                    t = time.perf_counter()
                    out = runner.rollout(progress=False, **kw)
                    walls[f"{n} workers"].append(time.perf_counter() - t)
                    assert len(out) == args.episodes and runner.stats.workers_lost == 0
            getattr(local_policy, "close", lambda: None)()
            for runner in runners.values():
                runner.close()
            base = statistics.median(walls["1 workers"])
            print(f"\n{name}: {args.episodes} episodes x {args.calls} calls, {args.tool_ms} ms tool work per call, concurrency {args.concurrency}")
            for path, ws in walls.items():
                wall = statistics.median(ws)
                results[f"{name}/{path}"] = {"episodes_per_s": args.episodes / wall, "steps_per_s": 1 / wall, "wall_s": wall}
                print(f"  {path:12s} {args.episodes / wall:8.1f} episodes/s  {1 / wall:6.3f} steps/s  x{base / wall:4.2f} vs 1 worker")
            overhead = (base - statistics.median(walls["in-process"])) / args.episodes
            results[f"{name}/ray_overhead_ms_per_episode"] = {"value": overhead * 1e3}
            print(f"  Ray path overhead vs in-process: {overhead * 1e3:+.2f} ms per episode")
    finally:
        ray.shutdown()
        proc.terminate()
        proc.wait(10)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
