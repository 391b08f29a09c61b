"""The hf prefix cache across calls (issue 49): one training step's rollout through the per-step
scheduler (the trainer's path), in three modes, in one run; and where the rollout's wall time goes.

    python bench/bench_prefix_cache.py                       # the main job's step (B4 x G8)
    AGENTGYM_LIGHTNING_SPIDER_DIR=../shared/data/spider python bench/bench_prefix_cache.py \\
        --env bench/spider_counts.py:make_env --env-kwarg split=train --tasks 2 --group-size 8 --temperature 0.7
    python bench/bench_prefix_cache.py --profile             # also CPU by package (needs yappi)

Modes, alternating for ``--rounds`` rounds on one policy (the cache emptied before each rollout,
as an update empties it in training):

* ``off``: ``prefix_caching=False``, every prompt token computed;
* ``running``: prefixes shared only among rows decoding at the same moment (``prefix_cache_mb=0``:
  the behaviour before the cache);
* ``cache``: and the keys and values of ended calls kept (``prefix_cache_mb``, default 512).

Same seeds, so the same tokens (the bench checks it). Printed per mode (medians): the rollout's
wall and CPU seconds (this process; an env's subprocesses, such as Spider's SQL workers, not
counted), prompt tokens sent and prefilled, and the split of the rollout's wall time: the
scheduler thread's prefill forwards, decode forwards, its own Python (sampling, batching, cache
copies), and the time it waited with no call to run (agents, gateway and env on the critical path).
With ``--profile``, the ``cache`` mode's rollout is run once more under yappi and its CPU seconds
are split by package: model (torch, transformers), the scheduler (``policies/hf.py``), the gateway
and driver (``agentgym_lightning``'s other modules), the agent framework and its HTTP client, the
env (``envs/``, sqlite3), other.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

from env_args import add_env_arguments, env_of  # noqa: E402

MODES = ("off", "running", "cache")


def env_factory(args: argparse.Namespace) -> Any:
    from agentgym_lightning.registration import make_env_factory

    factory = make_env_factory(*env_of(args))

    def make() -> Any:
        env = factory()
        env.seed_calls = True  # as the trainer: every call sampled from a seed of its own
        return env

    return make


class SchedulerClock:
    """Wall seconds the hf scheduler thread spends in prefill forwards, decode forwards, and its
    steps as a whole (admitting and stepping), from hooks on the model and the scheduler."""

    def __init__(self, policy: Any) -> None:
        from agentgym_lightning.policies.hf_scheduler import StepScheduler

        self.seconds: dict[str, float] = defaultdict(float)
        self._started: dict[int, tuple[str, float]] = {}
        model = policy.hf_model
        self._handles = [model.register_forward_pre_hook(self._pre, with_kwargs=True), model.register_forward_hook(self._post)]
        self._patched = []
        for name in ("_admit", "_step", "_step_slots"):
            original = getattr(StepScheduler, name)
            self._patched.append((name, original))
            setattr(StepScheduler, name, self._timed(original))

    def _pre(self, _module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
        kind = "decode" if kwargs["input_ids"].shape[1] == 1 else "prefill"
        self._started[threading.get_ident()] = (kind, time.perf_counter())

    def _post(self, _module: Any, _args: Any, _output: Any) -> None:
        kind, started = self._started.pop(threading.get_ident())
        self.seconds[kind] += time.perf_counter() - started

    def _timed(self, method: Any) -> Any:
        def timed(scheduler: Any, *args: Any) -> Any:
            started = time.perf_counter()
            try:
                return method(scheduler, *args)
            finally:
                self.seconds["busy"] += time.perf_counter() - started

        return timed

    def take(self) -> dict[str, float]:
        seconds, self.seconds = dict(self.seconds), defaultdict(float)
        return seconds

    def close(self) -> None:
        from agentgym_lightning.policies.hf_scheduler import StepScheduler

        for handle in self._handles:
            handle.remove()
        for name, original in self._patched:
            setattr(StepScheduler, name, original)


def set_mode(policy: Any, mode: str, budget: int) -> None:
    policy.prefix_caching = mode != "off"
    policy.prefix_cache.budget_bytes = budget if mode == "cache" else 0
    policy.prefix_cache.clear()


def run_rollout(policy: Any, args: argparse.Namespace) -> tuple[dict[str, float], list[tuple[int, ...]]]:
    """One step's episodes; returns what was measured and every call's tokens."""
    from agentgym_lightning.rollouts.in_process import rollout
    from agentgym_lightning.training.generation import SamplingOverride

    episodes = args.tasks * args.group_size
    before = policy.prefill_stats()
    started, cpu = time.perf_counter(), time.process_time()
    trajectories = rollout(env_factory(args), SamplingOverride(policy, temperature=args.temperature, max_tokens=args.max_tokens),
                           episodes=episodes, group_size=args.group_size, concurrency=episodes, seed=args.seed, progress=False)
    measured = {"wall": time.perf_counter() - started, "cpu": time.process_time() - cpu}
    after = policy.prefill_stats()
    measured.update({k: after[k] - before[k] for k in ("prompt_tokens", "prefilled_tokens", "prefix_cache_hits")})
    measured["cache_mb"] = after["prefix_cache_mb"]
    if not measured["prompt_tokens"]:
        raise SystemExit("the rollout did not go through the per-step scheduler (no prompt tokens counted): nothing to compare")
    trajectories.sort(key=lambda t: t.seed or 0)
    tokens = [tuple(s.completion.completion_token_ids or ()) for t in trajectories for s in t.steps if s.completion]
    measured["calls"] = len(tokens)
    return measured, tokens


def profile(policy: Any, args: argparse.Namespace) -> None:
    """The ``cache`` mode's rollout under yappi (CPU clock, every thread): self time by package."""
    try:
        import yappi
    except ImportError:
        raise SystemExit("--profile needs yappi: pip install yappi") from None
    groups = (("model (torch, transformers)", ("/torch/", "/transformers/", "/peft/")),
              ("scheduler (policies/hf.py, prefix_cache.py)", ("agentgym_lightning/policies/hf.py", "agentgym_lightning/policies/prefix_cache.py")),
              ("env (envs/, sqlite3, chromadb)", ("agentgym_lightning/envs/", "sqlite3", "/chromadb/", "/sqlglot/")),
              ("gateway, driver, episode (agentgym_lightning)", ("agentgym_lightning/",)),
              ("agent framework and its HTTP client", ("/langchain", "/langgraph", "/openai/", "/httpx/", "/httpcore/", "/autogen", "/agents/",
                                                       "/pydantic", "/anyio/", "/h11/", "/uvicorn/", "/starlette/", "/fastapi/")))
    set_mode(policy, "cache", args.budget)
    yappi.set_clock_type("cpu")
    yappi.start(builtins=True)
    try:
        run_rollout(policy, args)
    finally:
        yappi.stop()
    seconds: dict[str, float] = defaultdict(float)
    for stat in yappi.get_func_stats():
        where = f"{stat.module}:{stat.name}"
        group = next((name for name, needles in groups if any(n in where for n in needles)), "other (stdlib, builtins)")
        seconds[group] += stat.tsub
    total = sum(seconds.values())
    print(f"[profile] CPU seconds of the cache mode's rollout by package (yappi, self time, all threads; {total:.1f} s; "
          "yappi's own cost inflates Python-heavy parts):")
    for name, s in sorted(seconds.items(), key=lambda kv: -kv[1]):
        print(f"[profile]   {name:48s} {s:7.1f} s  {s / total:6.1%}")
    yappi.clear_stats()


def main() -> None:
    from agentgym_lightning.policies.prefix_cache import DEFAULT_PREFIX_CACHE_MB

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--tasks", type=int, default=4, help="B: tasks of the step (the main job: 4)")
    parser.add_argument("--group-size", type=int, default=8, help="G: episodes per task (the main job: 8)")
    parser.add_argument("--max-tokens", type=int, default=None, help="cap on a call's max tokens (default: the agent's)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the three modes (medians are printed)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (the trainer's default: 1.0)")
    parser.add_argument("--cache-mb", type=float, default=DEFAULT_PREFIX_CACHE_MB, help="the cache mode's prefix_cache_mb")
    parser.add_argument("--modes", default=",".join(MODES), help=f"the modes to run, comma-separated (default: {','.join(MODES)})")
    parser.add_argument("--profile", action="store_true", help="the cache mode once more under yappi: CPU by package")
    add_env_arguments(parser)
    args = parser.parse_args()
    args.budget = int(args.cache_mb * 2**20)
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes takes some of {', '.join(MODES)}, got {args.modes!r}")

    from agentgym_lightning.llm import ChatRequest
    from agentgym_lightning.policies.hf import HFPolicy

    policy = HFPolicy(args.model, device="cpu", max_batch_size=args.tasks * args.group_size, num_threads=args.threads, seed=args.seed)
    clock = SchedulerClock(policy)
    try:
        policy.submit(ChatRequest(messages=[{"role": "user", "content": "Hello"}])).result()  # warm-up
        clock.take()
        runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
        tokens: dict[str, list[tuple[int, ...]]] = {}
        for _ in range(args.rounds):
            for mode in modes:
                set_mode(policy, mode, args.budget)
                measured, tokens[mode] = run_rollout(policy, args)
                measured.update(clock.take())
                runs[mode].append(measured)
        if args.profile:
            clock.close()
            profile(policy, args)
    finally:
        clock.close()
        policy.close()

    env, env_kwargs = env_of(args)
    first = runs[modes[0]][0]
    print(f"[hf] {env} {env_kwargs}: {args.tasks} tasks x {args.group_size} episodes, {first['calls']:.0f} calls, "
          f"{first['prompt_tokens']:.0f} prompt tokens, {sum(map(len, tokens[modes[0]]))} completion tokens; {args.rounds} round(s), medians")
    cpu = {}
    for mode in modes:
        m = {k: statistics.median(r[k] for r in runs[mode]) for k in runs[mode][0]}
        cpu[mode] = m["cpu"]
        own = m.get("busy", 0.0) - m.get("prefill", 0.0) - m.get("decode", 0.0)
        print(f"[hf] {mode:8s} rollout {m['wall']:7.1f} s wall, {m['cpu']:7.1f} CPU-s; prompt tokens prefilled "
              f"{m['prefilled_tokens']:7.0f} of {m['prompt_tokens']:.0f} ({m['prefilled_tokens'] / m['prompt_tokens']:.2f}), "
              f"cache hits {m['prefix_cache_hits']:.0f}, cache {m['cache_mb']:.0f} MB")
        print(f"[hf] {mode:8s}   wall split: prefill {m.get('prefill', 0):6.1f} s, decode {m.get('decode', 0):6.1f} s, "
              f"scheduler Python {own:6.1f} s, waiting for agents/gateway/env {m['wall'] - m.get('busy', 0):6.1f} s")
    if "cache" in cpu:
        print("[hf] rollout CPU-s ratios: " + ", ".join(f"cache/{m} {cpu['cache'] / cpu[m]:.2f}" for m in modes if m != "cache"))
    same = all(tokens[m] == tokens[modes[0]] for m in modes)
    print(f"[hf] same tokens in every mode: {same}")

if __name__ == "__main__":
    main()
