"""Generation throughput through AgentEnv versus the same backend's raw batched generate.

    python bench/bench_generation.py                      # hf backend, embedded SmolLM2, CPU
    python bench/bench_generation.py --episodes 32 --concurrency 32 --device cuda

1. **env**: ``--episodes`` GuessNumber episodes run by the batched driver (``rollout``), all
   ``--concurrency`` of them at once; every ``policy.generate`` batch it makes is recorded.
   Throughput = completion tokens / wall time of the whole rollout (agents, gateway, driver,
   env bookkeeping and generation).
2. **raw**: the very same batches (same prompts, same batch composition, greedy so the same
   tokens) replayed straight into ``policy.generate``. Throughput = tokens / generate time.

Prints both and their ratio (env / raw; the target is >= 0.9: the env adds < 10% overhead).

The structure is one function per stage so that other backends can reuse it: build a policy,
call :func:`measure` (see ``bench_generation_vllm.py`` for the vLLM half).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from agentgym_lightning.llm import ChatRequest, Completion  # noqa: E402


@dataclass
class Throughput:
    tokens: int
    seconds: float
    calls: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


class RecordingPolicy:
    """Passes batches through to ``policy`` and remembers each batch's requests."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.batches: list[list[ChatRequest]] = []
        self.seconds = 0.0  # time spent inside the policy

    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        self.batches.append(list(requests))
        started = time.perf_counter()
        try:
            return self.policy.generate(requests)
        finally:
            self.seconds += time.perf_counter() - started


def _tokens(completions: Sequence[Completion]) -> int:
    return sum(len(c.completion_token_ids or []) for c in completions)


def run_env(
    policy: Any, env_factory: Callable[[], Any], *, episodes: int, concurrency: int
) -> tuple[Throughput, list[list[ChatRequest]], float]:
    """Episodes through AgentEnv + the batched driver; returns throughput, the batches made and
    the seconds spent inside ``policy.generate``."""
    from agentgym_lightning.rollouts.in_process import rollout

    recorder = RecordingPolicy(policy)
    started = time.perf_counter()
    trajectories = rollout(env_factory, recorder, episodes=episodes, concurrency=concurrency, progress=False)
    seconds = time.perf_counter() - started
    completions = [s.completion for t in trajectories for s in t.steps if s.completion is not None]
    return Throughput(_tokens(completions), seconds, len(completions)), recorder.batches, recorder.seconds


def run_raw(policy: Any, batches: Sequence[Sequence[ChatRequest]]) -> Throughput:
    """The same batches straight into ``policy.generate`` (only generate is timed)."""
    tokens, seconds, calls = 0, 0.0, 0
    for batch in batches:
        started = time.perf_counter()
        completions = policy.generate(batch)
        seconds += time.perf_counter() - started
        tokens += _tokens(completions)
        calls += len(completions)
    return Throughput(tokens, seconds, calls)


def measure(policy: Any, *, episodes: int, concurrency: int, max_guesses: int, label: str, repeats: int = 1) -> float:
    """Warm up, run env then raw (``repeats`` times, alternating, keeping the fastest of each:
    on a shared machine other processes' load is noise), print the numbers; returns env/raw."""
    from agentgym_lightning.envs.guess_number import make_env

    def factory() -> Any:
        return make_env(num_tasks=max(episodes, 1), max_guesses=max_guesses)

    # warm-up: first-call costs (allocator, kernels, tokenizer caches) are not what we measure
    policy.generate([ChatRequest(messages=[{"role": "user", "content": "Hello"}], sampling=_greedy(4))])

    env, batches, in_policy = run_env(policy, factory, episodes=episodes, concurrency=concurrency)
    raw = run_raw(policy, batches)
    for _ in range(repeats - 1):
        env2, batches2, in_policy2 = run_env(policy, factory, episodes=episodes, concurrency=concurrency)
        if env2.seconds < env.seconds:
            env, batches, in_policy = env2, batches2, in_policy2
        raw2 = run_raw(policy, batches)
        if raw2.seconds < raw.seconds:
            raw = raw2
    ratio = env.tokens_per_s / raw.tokens_per_s if raw.tokens_per_s else 0.0
    sizes = [len(b) for b in batches]
    print(f"[{label}] {episodes} episodes, concurrency {concurrency}: {len(batches)} generate batches "
          f"(mean size {sum(sizes) / max(len(sizes), 1):.1f}), {env.calls} LLM calls")
    print(f"[{label}] env : {env.tokens:6d} tokens in {env.seconds:7.2f} s = {env.tokens_per_s:8.1f} tok/s "
          f"({in_policy:.2f} s of it inside generate)")
    print(f"[{label}] raw : {raw.tokens:6d} tokens in {raw.seconds:7.2f} s = {raw.tokens_per_s:8.1f} tok/s")
    print(f"[{label}] ratio env/raw = {ratio:.3f} (target >= 0.9)")
    # Noise-free view of the same thing: the share of the env run spent generating.
    print(f"[{label}] time inside generate / env wall time = {in_policy / env.seconds:.3f}")
    return ratio


def _greedy(max_tokens: int) -> Any:
    from agentgym_lightning.llm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens)


def bench_hf(args: argparse.Namespace) -> float:
    """The ``hf`` backend (transformers generate)."""
    from agentgym_lightning.policies.hf import HFPolicy

    started = time.perf_counter()
    policy = HFPolicy(args.model, device=args.device, max_batch_size=args.concurrency, num_threads=args.threads)
    print(f"[hf] model {args.model} loaded on {policy.device} in {time.perf_counter() - started:.1f} s")
    try:
        return measure(
            policy,
            episodes=args.episodes,
            concurrency=args.concurrency,
            max_guesses=args.max_guesses,
            label="hf",
            repeats=args.repeats,
        )
    finally:
        policy.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-guesses", type=int, default=4, help="LLM calls per GuessNumber episode at most")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--repeats", type=int, default=1, help="alternate env/raw runs this often, keep the best")
    args = parser.parse_args(argv)
    bench_hf(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
