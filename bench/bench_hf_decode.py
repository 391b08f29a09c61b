"""``hf``'s decode step, each way it runs, on one batch of staggered calls: per-step with the
dynamic KV cache (its layers growing in place: ``dynamic``; or transformers' own, which
concatenates every step: ``dynamic-concat``), the static one, and the static one compiled (CUDA graphs). (The ``batches``
mode, ``generate`` decoding each batch to its end, was dropped with the batch loop: every call
now goes through the per-step scheduler, so there is no other way to compare against.)

    python bench/bench_hf_decode.py --device cuda                       # SmolLM2-135M, 16 calls x 128 tokens
    python bench/bench_hf_decode.py --device cuda --random-init DIR     # DIR: a model's config + tokenizer only
    python bench/bench_hf_decode.py --device cpu --calls 32 --max-tokens 64 --modes dynamic-concat,dynamic,dynamic-concat,dynamic

Half the calls are submitted at once, the rest within 0.5 s (agents' calls arriving while others
decode). Sampled (temperature 1) and seeded, so every mode should give the first mode's tokens;
prints per mode the warm-up (the compile and graph recording for ``compiled``), the walls of two
rounds (and the process's CPU-seconds), completion tokens per second, and how many calls got the
first mode's tokens; a mode named twice runs twice (interleave them on a busy machine). Needs no
env or agent (for the rollout through agents: ``bench/bench_rollout_engine.py``).
``--random-init`` builds the model from the folder's config with random weights (timing and
equality only; the weights need not travel).
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from agentgym_lightning.llm import ChatRequest, SamplingParams  # noqa: E402

MODES = ("dynamic", "dynamic-concat", "static", "compiled")


def calls(n: int, max_tokens: int) -> list[ChatRequest]:
    rng = random.Random(0)
    return [ChatRequest(messages=[{"role": "system", "content": "You write SQL. " * 40},
                                  {"role": "user", "content": f"Question {i}: " + "how many rows " * rng.randint(1, 30)}],
                        sampling=SamplingParams(temperature=1.0, max_tokens=max_tokens - (i % 4) * 8, seed=i)) for i in range(n)]


def staggered(policy: Any, requests: list[ChatRequest], seed: int = 0) -> list[Any]:
    rng = random.Random(seed)
    delays = [0.0 if i < len(requests) // 2 else rng.uniform(0.0, 0.5) for i in range(len(requests))]
    futures: list[Any] = [None] * len(requests)

    def send(i: int) -> None:
        time.sleep(delays[i])
        futures[i] = policy.submit(requests[i])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [f.result(600) for f in futures]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--random-init", default=None, metavar="DIR", help="a model folder (config + tokenizer): random weights")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--calls", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")  # the fallbacks, said once
    import torch
    import transformers

    from agentgym_lightning.policies.hf import HFPolicy

    model = args.model
    if args.random_init:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        model = tempfile.mkdtemp(prefix="bench-hf-decode-")
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.random_init), dtype=torch.float32).save_pretrained(model)
        AutoTokenizer.from_pretrained(args.random_init).save_pretrained(model)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    device_name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "CPU"
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {device_name}; {args.calls} calls x "
          f"<= {args.max_tokens} tokens, {args.dtype}", flush=True)
    from agentgym_lightning.policies import hf_kv, hf_scheduler

    growing = hf_kv.new_cache
    first: list[Any] | None = None
    for mode in args.modes.split(","):
        if mode not in MODES:
            parser.error(f"--modes: {mode!r} is not one of {MODES}")
        # dynamic-concat: the dynamic cache as transformers makes it (DynamicLayer.update concatenates).
        make = (lambda m: transformers.DynamicCache(config=m.config)) if mode == "dynamic-concat" else growing
        hf_kv.new_cache = hf_scheduler.new_cache = make
        policy = HFPolicy(model, device=args.device, dtype=args.dtype, max_batch_size=args.calls, seed=0, progress=False,
                          decode="dynamic" if mode == "dynamic-concat" else mode)
        try:
            warm = calls(4, 16)
            started = time.perf_counter()
            policy.generate(warm)
            for _ in range(3):
                staggered(policy, warm)
            sync()
            warm_up = time.perf_counter() - started
            requests = calls(args.calls, args.max_tokens)
            walls, cpus = [], []
            for r in range(2):
                started, cpu = time.perf_counter(), time.process_time()
                got = staggered(policy, requests, seed=r)
                sync()
                walls.append(time.perf_counter() - started)
                cpus.append(time.process_time() - cpu)
            tokens = sum(len(c.completion_token_ids) for c in got)
            first = first or got
            same = sum(a.completion_token_ids == b.completion_token_ids for a, b in zip(first, got))
            ran = f", ran as {policy._scheduler.mode}" if policy._scheduler is not None else ""  # noqa: SLF001 - after fallbacks
            print(f"  {mode:14s}: warm-up {warm_up:6.1f} s, walls {[round(w, 2) for w in walls]} s, "
                  f"CPU {[round(c, 2) for c in cpus]} s, {tokens} tokens, "
                  f"{tokens / min(walls):7.1f} tokens/s; {same}/{len(got)} calls with the first mode's tokens{ran}", flush=True)
        finally:
            policy.close()


if __name__ == "__main__":
    main()
