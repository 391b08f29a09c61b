"""Rollout and generate seconds with and without prefix caching, on the same requests, in one run.

    python bench/bench_prefix_caching.py                       # hf backend, SmolLM2-135M, the main job's step
    python bench/bench_prefix_caching.py --tasks 2 --rounds 3 --threads 1
    .venv-vllm/bin/python bench/bench_prefix_caching.py --backend vllm
    AGENTGYM_LIGHTNING_SPIDER_DIR=/work/shared/data/spider python bench/bench_prefix_caching.py \\
        --env bench/spider_counts.py:make_env --env-kwarg split=train --tasks 2 --group-size 8 --temperature 0.7 --rounds 1 --no-generate-replay

The workload is one training step: by default the main job's (``make run``):
``lightning/Arithmetic-v0`` (difficulty 3, one worked example), else the env that ``--env`` /
``--env-kwarg`` name (``bench/env_args.py``; the Spider step above: the LangGraph SQL agent on
Spider's count questions, B2 x G8, as in ``bench/bench_update.py``). ``--tasks`` tasks x
``--group-size`` episodes, every call sampled at ``--temperature`` (default 1, the trainer's)
with the call seeds the trainer gives it, at most ``--max-tokens`` tokens (default: the agent's own: 256 in the main job, 384
for Spider). The G episodes of a task send the same first prompt, and every prompt starts with
the same system prompt (and the main job's worked example, or Spider's schema).

1. **rollout**: the step's episodes through the batched driver, once with prefix caching off and
   once on, alternating for ``--rounds`` rounds (medians of wall and CPU seconds). Same seeds, so
   the same tokens: the bench checks it.
2. **generate**: the ``policy.generate`` batches that rollout made, replayed off / on
   alternately (only ``generate`` timed): the backend's own difference without the agents'
   and driver's time around it (``--no-generate-replay``: skipped).

Prints seconds, the ratio off / on (> 1: caching is faster), and whether the completions were
identical. For ``hf`` the two modes are one policy with ``prefix_caching`` switched; for ``vllm``
two engines (``enable_prefix_caching`` on and off), built one after the other.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_generation import RecordingPolicy  # noqa: E402
from env_args import add_env_arguments, env_of  # noqa: E402

from agentgym_lightning.llm import ChatRequest, Completion  # noqa: E402


def env_factory(args: argparse.Namespace) -> Callable[[], Any]:
    """The env factory of `args` (`--env`, `--env-kwarg`), each env seeding its calls as the trainer does."""
    from agentgym_lightning.registration import make_env_factory

    factory = make_env_factory(*env_of(args))

    def make() -> Any:
        env = factory()
        env.seed_calls = True  # what the trainer does: every call sampled from a seed of its own
        return env

    return make


def _answers(completions: Sequence[Completion]) -> list[tuple[int, ...]]:
    return [tuple(c.completion_token_ids or ()) for c in completions]


def run_rollout(policy: Any, args: argparse.Namespace) -> tuple[float, float, list[list[ChatRequest]], list[tuple[int, ...]]]:
    """One step's episodes; returns wall and CPU seconds (the process's), the generate batches,
    every call's tokens."""
    from agentgym_lightning.rollouts.in_process import rollout
    from agentgym_lightning.training.generation import SamplingOverride

    recorder = RecordingPolicy(policy)  # inside the override: it records the requests as sampled
    episodes = args.tasks * args.group_size
    started, cpu = time.perf_counter(), time.process_time()
    trajectories = rollout(env_factory(args), SamplingOverride(recorder, temperature=args.temperature, max_tokens=args.max_tokens), episodes=episodes, group_size=args.group_size,
                           concurrency=episodes, seed=args.seed, progress=False)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
    trajectories.sort(key=lambda t: t.seed or 0)
    tokens = [tuple(s.completion.completion_token_ids or ()) for t in trajectories for s in t.steps if s.completion]
    return seconds, cpu_seconds, recorder.batches, tokens


def replay(policy: Any, batches: Sequence[Sequence[ChatRequest]]) -> tuple[float, list[tuple[int, ...]]]:
    seconds, answers = 0.0, []
    for batch in batches:
        started = time.perf_counter()
        answers += _answers(policy.generate(batch))
        seconds += time.perf_counter() - started
    return seconds, answers


class _Modes:
    """The policy with prefix caching off and on (one hf policy switched; two vLLM engines)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.policies: dict[bool, Any] = {}
        if args.backend == "hf":
            from agentgym_lightning.policies.hf import HFPolicy

            self.hf = HFPolicy(args.model, device=args.device, max_batch_size=args.tasks * args.group_size,
                               num_threads=args.threads, seed=args.seed)
        else:
            from agentgym_lightning.policies.vllm import VLLMPolicy

            for caching in (False, True):
                self.policies[caching] = VLLMPolicy(args.model, seed=args.seed, prefix_caching=caching)

    def get(self, caching: bool) -> Any:
        if self.args.backend == "hf":
            self.hf.prefix_caching = caching
            return self.hf
        return self.policies[caching]

    def close(self) -> None:
        for policy in [getattr(self, "hf", None), *self.policies.values()]:
            if policy is not None:
                policy.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="cpu", help="hf only")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (hf; default: torch's)")
    parser.add_argument("--tasks", type=int, default=4, help="B: tasks of the step (the main job: 4)")
    parser.add_argument("--group-size", type=int, default=8, help="G: episodes per task (the main job: 8)")
    parser.add_argument("--max-tokens", type=int, default=None, help="cap on a call's max tokens (default: the agent's 256, as the main job)")
    parser.add_argument("--rounds", type=int, default=2, help="off/on rounds (medians are printed)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (the trainer's default: 1.0)")
    parser.add_argument("--generate-replay", action=argparse.BooleanOptionalAction, default=True,
                        help="part 2, the generate batches replayed (--no-generate-replay: the rollouts only)")
    add_env_arguments(parser)
    args = parser.parse_args()

    modes = _Modes(args)
    try:
        # warm-up: first-call costs are not what we measure
        modes.get(True).generate([ChatRequest(messages=[{"role": "user", "content": "Hello"}])] * 2)
        rollout_s: dict[bool, list[float]] = {False: [], True: []}
        rollout_cpu_s: dict[bool, list[float]] = {False: [], True: []}
        tokens: dict[bool, list[tuple[int, ...]]] = {}
        batches: list[list[ChatRequest]] = []
        for _ in range(args.rounds):
            for caching in (False, True):
                seconds, cpu_seconds, made, tokens[caching] = run_rollout(modes.get(caching), args)
                rollout_s[caching].append(seconds)
                rollout_cpu_s[caching].append(cpu_seconds)
                batches = batches or made
        generate_s: dict[bool, list[float]] = {False: [], True: []}
        answers: dict[bool, list[tuple[int, ...]]] = {}
        for _ in range(args.rounds if args.generate_replay else 0):
            for caching in (False, True):
                seconds, answers[caching] = replay(modes.get(caching), batches)
                generate_s[caching].append(seconds)
    finally:
        modes.close()

    calls = sum(len(b) for b in batches)
    env, env_kwargs = env_of(args)
    print(f"[{args.backend}] {env} {env_kwargs}: {args.tasks} tasks x {args.group_size} episodes, {calls} calls in {len(batches)} "
          f"generate batches, {sum(map(len, tokens[True]))} completion tokens; {args.rounds} rounds, medians")
    measured = [("rollout", rollout_s), ("rollout CPU", rollout_cpu_s)] + ([("generate", generate_s)] if args.generate_replay else [])
    for name, seconds in measured:
        off, on = statistics.median(seconds[False]), statistics.median(seconds[True])
        print(f"[{args.backend}] {name:11s}: prefix caching off {off:7.2f} s, on {on:7.2f} s, off/on = {off / on:.2f}  "
              f"(off {[round(s, 1) for s in seconds[False]]}, on {[round(s, 1) for s in seconds[True]]})")
    print(f"[{args.backend}] same tokens with and without: rollout {tokens[False] == tokens[True]}"
          + (f", generate {answers[False] == answers[True]}" if args.generate_replay else ""))
    print(f"[{args.backend}] peak RSS of this process (both modes): {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
