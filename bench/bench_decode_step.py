"""One decode step of the bundled model, alone: what it costs at each batch size and where it goes.

    python bench/bench_decode_step.py                           # SmolLM2-135M, rows 1/8/32, 300 cached tokens
    python bench/bench_decode_step.py --rows 1 32 64 --context 600 --threads 2

``hf``'s decode loop spends most of a rollout in the model's forward pass for one new token a row
(docs/training.md, issue 49). This times that forward pass with ``hf``'s own KV cache
(``hf_kv.new_cache``, layers growing in place) over ``--context`` cached tokens, left padding on
half the rows as in a real batch, and prints, per batch size: wall and CPU-seconds a step, the
model's multiply-adds as GFLOP/s (2 x the parameters a row: the matmuls, attention left out), and
the share of the step's operator time in matrix multiplies, attention and the rest (torch's
profiler). Then the machine's own fp32 matmul rate (a 2,048 x 2,048 product) as the ceiling, so
the ratio says how far the decode step is from the hardware. Nothing here touches an env or agent.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

_MATMUL = ("aten::mm", "aten::addmm", "aten::bmm")
_ATTENTION = ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_attention_math",
              "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_flash_attention")


def matmul_gflops(torch, size: int = 2048, repeats: int = 5) -> float:
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    started = time.perf_counter()
    for _ in range(repeats):
        torch.mm(a, b)
    return 2 * size**3 * repeats / (time.perf_counter() - started) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="a model name or folder (default: the bundled SmolLM2-135M)")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32], help="batch sizes (rows decoding at once)")
    parser.add_argument("--context", type=int, default=300, help="cached tokens a row (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=8, help="decode steps timed per batch size (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default: %(default)s)")
    args = parser.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM

    from agentgym_lightning.policies.hf_kv import cache_kwarg, new_cache
    from agentgym_lightning.policies.models import resolve_model

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(resolve_model(args.model, progress=False), dtype=torch.float32).eval()
    params = sum(p.numel() for p in model.parameters())
    print(f"torch {torch.__version__}, {args.threads} thread(s); {args.model}: {params / 1e6:.0f}M parameters, "
          f"{args.context} cached tokens a row, {args.steps} steps timed per batch size")
    print(f"{'rows':>5} {'wall/step':>10} {'CPU-s/step':>11} {'GFLOP/s':>8} {'tokens/s':>9} {'matmul':>7} {'attention':>9} {'other':>6}")
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for rows in args.rows:
            ids = torch.randint(100, 10_000, (rows, args.context), generator=gen)
            mask = torch.ones(rows, args.context + args.steps + 2, dtype=torch.long)
            mask[1::2, : args.context // 10] = 0  # left padding on every second row, as a batch of unequal prompts has
            cache = new_cache(model)
            width = args.context
            model(input_ids=ids, attention_mask=mask[:, :width], **cache_kwarg(model, cache), use_cache=True, logits_to_keep=1)
            token = torch.randint(100, 10_000, (rows, 1), generator=gen)

            def step() -> None:
                nonlocal width
                width += 1
                model(input_ids=token, attention_mask=mask[:, :width], **cache_kwarg(model, cache), use_cache=True, logits_to_keep=1)

            step()  # warm
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(args.steps - 1):
                step()
            wall, cpu = (time.perf_counter() - wall) / (args.steps - 1), (time.process_time() - cpu) / (args.steps - 1)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                step()
            times = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
            total = sum(times.values()) or 1.0
            mm = sum(t for k, t in times.items() if k in _MATMUL) / total
            attention = sum(t for k, t in times.items() if k in _ATTENTION) / total
            print(f"{rows:>5} {wall:>9.3f}s {cpu:>10.3f}s {2 * params * rows / wall / 1e9:>8.1f} {rows / wall:>9.1f} "
                  f"{mm:>7.0%} {attention:>9.0%} {1 - mm - attention:>6.0%}")
    ceiling = matmul_gflops(torch)
    print(f"this machine's fp32 matmul (2,048 x 2,048, {args.threads} thread(s)): {ceiling:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
