"""A step's rollout with the calls batched (``generate``) vs scheduled per decode step (``submit``), in one run.

    python bench/bench_rollout_engine.py --threads 1                      # the main job's step (B4 x G8)
    AGENTGYM_LIGHTNING_SPIDER_DIR=/work/shared/data/spider python bench/bench_rollout_engine.py --threads 1 \\
        --env lightning/Spider-v0 --env-kwarg agent=langgraph --env-kwarg split=train \\
        --tasks 1 --group-size 4 --temperature 0.7 --rounds 1        # quick: 1 task x G4 of the Spider step
    ... --tasks 2 --group-size 8                                      # the Spider step (B2 x G8)

The workload is one training step (``bench/env_args.py``: the main job's env by default, or
``--env``/``--env-kwarg``): ``--tasks`` x ``--group-size`` episodes, every call sampled at
``--temperature`` and seeded as the trainer seeds it (``seed_calls``), through the in-process
driver with one ``hf`` policy, two ways, alternating for ``--rounds`` rounds:

* **batches** (before): the driver sees only ``policy.generate``, so it gathers pending calls into
  batches (``max_batch_wait``) and a call that arrives while a batch decodes waits for all of it;
* **per-step** (after): the driver hands each call to ``policy.submit`` as it comes; it joins the
  running batch at the next decode step and is answered when its own row ends.

Prints, per mode (medians over rounds): wall and CPU seconds of this process (the agents, the
gateway and the driver run in it too), completion tokens per wall second, and the seconds calls
waited for the generator (from the agent's request to its answer: ``StepTimings``) at p50 and
p95; then whether both modes produced the same tokens, call for call. The machine's load average
is printed before and after (this bench is meant for a quiet machine; on a shared one, say so).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_prefix_caching import env_factory  # noqa: E402
from env_args import add_env_arguments, env_of  # noqa: E402

from agentgym_lightning.llm import ChatRequest, Completion  # noqa: E402

MODES = ("batches", "per-step")


class BatchesOnly:
    """The policy's ``generate`` alone (no ``submit``): what the driver had before."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        return self.policy.generate(requests)


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def run_rollout(policy: Any, args: argparse.Namespace) -> dict[str, Any]:
    """One step's episodes; its wall and CPU seconds, tokens, call waits and every call's ids."""
    from agentgym_lightning.rollouts.in_process import rollout
    from agentgym_lightning.training.generation import SamplingOverride

    episodes = args.tasks * args.group_size
    started, cpu = time.perf_counter(), time.process_time()
    trajectories = rollout(env_factory(args), SamplingOverride(policy, temperature=args.temperature, max_tokens=args.max_tokens),
                           episodes=episodes, group_size=args.group_size, concurrency=episodes, seed=args.seed, progress=False)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
    trajectories.sort(key=lambda t: t.seed or 0)
    steps = [s for t in trajectories for s in t.steps if s.completion is not None]
    waits = [s.timings.answered_at - s.timings.requested_at for s in steps if s.timings.answered_at is not None]
    tokens = [tuple(s.completion.completion_token_ids or ()) for s in steps]
    prompts = [tuple(s.completion.prompt_token_ids or ()) for s in steps]
    return {"wall": seconds, "cpu": cpu_seconds, "tokens": tokens, "prompts": prompts, "completion_tokens": sum(map(len, tokens)),
            "calls": len(steps), "wait_p50": _percentile(waits, 0.5), "wait_p95": _percentile(waits, 0.95),
            "statuses": sorted({t.status.value for t in trajectories})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--tasks", type=int, default=4, help="B: tasks of the step (the main job: 4)")
    parser.add_argument("--group-size", type=int, default=8, help="G: episodes per task (the main job: 8)")
    parser.add_argument("--max-tokens", type=int, default=None, help="cap on a call's max tokens (default: the agent's own)")
    parser.add_argument("--rounds", type=int, default=1, help="batches / per-step rounds (medians are printed)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (the trainer's default: 1.0)")
    add_env_arguments(parser)
    args = parser.parse_args()

    from agentgym_lightning.policies.hf import HFPolicy

    load_before = os.getloadavg()
    policy = HFPolicy(args.model, device=args.device, max_batch_size=args.tasks * args.group_size,
                      num_threads=args.threads, seed=args.seed)
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    try:
        policy.generate([ChatRequest(messages=[{"role": "user", "content": "Hello"}])] * 2)  # warm-up
        for _ in range(args.rounds):
            for mode in MODES:
                runs[mode].append(run_rollout(BatchesOnly(policy) if mode == "batches" else policy, args))
    finally:
        policy.close()
    load_after = os.getloadavg()

    env, env_kwargs = env_of(args)
    first = runs["per-step"][0]
    print(f"[hf {policy.device}] {env} {env_kwargs}: {args.tasks} tasks x {args.group_size} episodes, {first['calls']} calls, "
          f"{first['completion_tokens']} completion tokens, temperature {args.temperature}; {args.rounds} round(s), medians; "
          f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after ({os.cpu_count()} CPUs)")
    median: dict[str, dict[str, float]] = {}
    for mode in MODES:
        m = {key: statistics.median(r[key] for r in runs[mode]) for key in ("wall", "cpu", "completion_tokens", "wait_p50", "wait_p95")}
        median[mode] = m
        print(f"  {mode:9s}: wall {m['wall']:7.1f} s, CPU {m['cpu']:7.1f} s, {m['completion_tokens'] / m['wall']:6.1f} completion tokens/s, "
              f"call waited for the generator p50 {m['wait_p50']:6.2f} s / p95 {m['wait_p95']:6.2f} s"
              f"  (walls {[round(r['wall'], 1) for r in runs[mode]]}, statuses {runs[mode][0]['statuses']})")
    b, p = median["batches"], median["per-step"]
    print(f"  per-step / batches: wall {p['wall'] / b['wall']:.2f}x, CPU {p['cpu'] / b['cpu']:.2f}x")
    base = runs["batches"][0]
    same = all(r["tokens"] == base["tokens"] for mode in MODES for r in runs[mode])
    print(f"  same tokens, call for call, in every run: {same}")
    if not same:
        for mode in MODES:
            for r in runs[mode]:
                calls = list(zip(base["prompts"], base["tokens"], r["prompts"], r["tokens"]))
                other_prompt = sum(bp != rp for bp, _, rp, _ in calls)
                other_answer = [(i, next((j for j, (x, y) in enumerate(zip(bt, rt)) if x != y), min(len(bt), len(rt))))
                                for i, (bp, bt, rp, rt) in enumerate(calls) if bp == rp and bt != rt]
                print(f"  {mode}: {len(r['tokens'])} calls vs {len(base['tokens'])}; {other_prompt} with another prompt "
                      f"(the agent went another way), {len(other_answer)} with the same prompt and another answer "
                      f"(call, first differing token): {other_answer}")


if __name__ == "__main__":
    main()
