"""Asynchronous training (``max_staleness`` k): wall time and CPU-seconds of the same number of
updates at k = 0, 1, 2, side by side in one run, on the embedded SmolLM2-135M (fp32, CPU).

Two envs:

(a) ``main``: the main job's env (``lightning/Arithmetic-v0``, difficulty 3, one worked example,
    the calculator AIR; the Makefile's ``make run``), at a smaller B x G by default so that a
    bench run stays short on a shared machine (``--main-tasks``, ``--main-group``).
(b) ``tool``: an agent that calls a tool after each of its first LLM calls (``--tool-calls``, 3)
    and answers with one more; the tool takes what a search or SQL service takes: a latency drawn
    uniformly from 0.5-2.0 s per call (``--tool-latency``), seeded from the episode, so every k
    waits the same. Its reward (the parity of the answer's
    length) differs within groups, so every step really updates.

The same rows per step at every k: ``tasks_per_step`` groups of ``group_size`` episodes. Wall
time is ``trainer.train()`` (no eval): the steps, the final checkpoint and, at k >= 1, stopping
the producer; ``steps s`` is the steps alone (the sum of ``time/step_s``: from the first rollout
to the last update's sync), and the speed-up is taken on it. CPU-seconds are this process's
user+system time over ``train()`` (every thread: generator and update). At k >= 1 the producer
runs ahead of the last update, and those episodes' CPU time is counted too.
The k runs go one after another, so the machine's load at the time is printed (``uptime``).

``--rollout-workers N`` runs the episodes on N Ray actors (``rollout_workers: N``; docs/training.md
"Rollouts on Ray workers"): the agents, their envs and their tool waits are in the workers, the
generator and the update in this process (served to the workers over HTTP), so CPU-seconds are
still this process's (generation, update and serving) and not the workers'. Needs
``agentgym-lightning[ray]``; the first run starts a local Ray, which every k after it reuses.

Besides wall and CPU time each row gives what a step waited on (means per step): ``update s``
the update, ``wait s`` the update waiting for its episodes (``async/update_wait_s`` at k >= 1),
``gen wait s`` the producer waiting for weights to start a plan (``async/generator_wait_s``),
``sync s`` the weight copy into the generator, and the staleness of the calls trained on.

    python bench/bench_async.py                    # both envs, k = 0, 1, 2
    python bench/bench_async.py --env tool --steps 4 --ks 0 1
    python bench/bench_async.py --env tool --ks 0 1 --rollout-workers 2
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import subprocess
import tempfile
import time
from typing import Any



def _tool_agent(latency: tuple[float, float], tool_calls: int) -> Any:
    def agent(task: dict, ctx: Any) -> str:
        messages = [{"role": "user", "content": f"Search for: {task['q']}. Say what to search, in a few words."}]
        rng = random.Random(ctx.seed)  # the episode's reset seed: the same waits at every k
        for _ in range(tool_calls):
            query = ctx.chat_completion(messages, max_tokens=12)
            time.sleep(rng.uniform(*latency))  # the search service answers
            messages += [{"role": "assistant", "content": query.text}, {"role": "user", "content": "Results: (3 documents). Search again or answer."}]
        return ctx.chat_completion(messages, max_tokens=12).text

    return agent


def _tool_env(latency: tuple[float, float], tool_calls: int) -> Any:
    from agentgym_lightning.env import AgentEnv

    agent = _tool_agent(latency, tool_calls)

    def make() -> AgentEnv:
        return AgentEnv(agent, [{"q": f"topic {i}"} for i in range(64)], lambda task, result: float(len(result or "") % 2), time_limit=120)

    return make


def _config(env: str, k: int, steps: int, tasks: int, group: int, output_dir: str, model: str, device: str, workers: int) -> Any:
    from agentgym_lightning.training import LightningRLConfig

    common = dict(max_steps=steps, tasks_per_step=tasks, num_generations=group, output_dir=output_dir, report_to=[],
                  progress=False, save_steps=10_000, max_staleness=k, seed=0, model=model, device=device, rollout_workers=workers)
    if env == "main":
        return LightningRLConfig(
            env="lightning/Arithmetic-v0", env_kwargs={"difficulty": 3, "examples": 1}, air_weights={"math.calc_ok": 0.5},
            learning_rate=2e-5, gradient_checkpointing=True, micro_batch_tokens=1024, optim="adafactor", **common,
        )
    return LightningRLConfig(env="tool", learning_rate=2e-5, max_completion_length=12, **common)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _run(env: str, k: int, args: argparse.Namespace) -> dict[str, float]:
    from agentgym_lightning.training import LightningRLTrainer

    tasks, group = (args.main_tasks, args.main_group) if env == "main" else (args.tool_tasks, args.tool_group)
    with tempfile.TemporaryDirectory(prefix=f"bench-async-{env}-k{k}-") as out:
        config = _config(env, k, args.steps, tasks, group, out, args.model, args.device, args.rollout_workers)
        trainer = LightningRLTrainer(config, env=_tool_env(tuple(args.tool_latency), args.tool_calls) if env == "tool" else None)
        cpu, wall = _cpu_seconds(), time.perf_counter()
        result = trainer.train()
        if result.interrupted:  # a run cut short (Ctrl-C, SIGTERM: an outer `timeout`) does not compare
            raise SystemExit(f"bench_async: the {env} run at k = {k} was interrupted ({result.signal}) after "
                             f"{result.steps} of {args.steps} updates: its row would not compare; give it more time")
        wall, cpu = time.perf_counter() - wall, _cpu_seconds() - cpu
        trainer.policy.close()
    history = result.history
    mean = lambda key: sum(h.get(key, 0.0) for h in history) / len(history)  # noqa: E731
    return {
        "wall_s": wall, "steps_s": sum(h["time/step_s"] for h in history), "cpu_s": cpu, "updates": float(result.steps), "rows": mean("samples/rows"),
        "update_s": mean("time/update_s"), "wait_s": mean("time/rollout_s"), "sync_s": mean("time/sync_s"),
        "gen_wait_s": mean("async/generator_wait_s"),
        "staleness_mean": mean("async/staleness_mean"), "staleness_max": max(h.get("async/staleness_max", 0.0) for h in history),
        "dropped": sum(h.get("async/groups_dropped", 0.0) for h in history),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", choices=("main", "tool", "both"), default="both")
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=3, help="updates per run (the same at every k)")
    parser.add_argument("--model", default="smollm2-135m", help="the model (default: the embedded SmolLM2-135M)")
    parser.add_argument("--device", default="auto", help="where the model runs (auto: CUDA when there is one)")
    parser.add_argument("--main-tasks", type=int, default=2)
    parser.add_argument("--main-group", type=int, default=4)
    parser.add_argument("--tool-tasks", type=int, default=2)
    parser.add_argument("--tool-group", type=int, default=4)
    parser.add_argument("--tool-latency", type=float, nargs=2, default=[0.5, 2.0], metavar=("LOW", "HIGH"))
    parser.add_argument("--tool-calls", type=int, default=3, help="tool calls per episode, each after an LLM call")
    parser.add_argument("--rollout-workers", type=int, default=0, metavar="N",
                        help="run the episodes on N Ray workers (rollout_workers; default 0: in this process)")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    envs = ("main", "tool") if args.env == "both" else (args.env,)
    where = f"{args.rollout_workers} Ray workers" if args.rollout_workers else "in process"
    print(f"episodes: {where}; load before: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    print(f"{'env':<5} {'k':>2} {'updates':>7} {'rows/step':>9} {'wall s':>8} {'steps s':>8} {'cpu s':>8} {'speed-up':>8} "
          f"{'update s':>8} {'wait s':>7} {'gen wait s':>10} {'sync s':>6} {'stale mean':>10} {'max':>4} {'dropped':>7}")
    for env in envs:
        base = None
        for k in args.ks:
            r = _run(env, k, args)
            base = base if base is not None else r["steps_s"]
            print(f"{env:<5} {k:>2} {r['updates']:>7.0f} {r['rows']:>9.1f} {r['wall_s']:>8.1f} {r['steps_s']:>8.1f} {r['cpu_s']:>8.1f} "
                  f"{base / r['steps_s']:>7.2f}x {r['update_s']:>8.2f} {r['wait_s']:>7.2f} {r['gen_wait_s']:>10.2f} {r['sync_s']:>6.2f} {r['staleness_mean']:>10.2f} "
                  f"{r['staleness_max']:>4.0f} {r['dropped']:>7.0f}", flush=True)
    print(f"load after:  {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    print("speed-up: the k = first row's steps s over this row's; wait s: what each update waited for its episodes; "
          "gen wait s: what the producer waited for weights")


if __name__ == "__main__":
    main()
