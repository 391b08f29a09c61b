"""The update on a run's saved rows: padded rows against the token tree, side by side in one run.

Replays the trajectories a training run saved (``OUTPUT_DIR/trajectories/step-*.jsonl``, e.g. the
main job's ``runs/main``) through :meth:`LightningRLTrainer.update` twice per step — the padded
row-by-row update (``packed_update=False``) and the token-tree update (``True``) — each from the
same initial weights, in its own process (so each one's peak RSS is its own), alternating. Per
step it prints the update's wall and CPU seconds (CPU seconds are the steadier measure on a
shared machine), the token positions the trained forward ran against the rows'
total and unique tokens, the peak RSS, and the loss and grad norm of both (they must agree);
then the medians and ratios (padded / tree), and the check forward <= 1.25 x unique.

The trainer's config is the run's own (its newest checkpoint's ``trainer_state.json``: env,
model, loss, credit, ``agent_match``, LoRA...), so the rows and the loss are the ones that run
trained on; ``--micro-batch-tokens`` and ``--[no-]gradient-checkpointing`` default to the run's
too. A run without a checkpoint is replayed with the config's defaults on ``--env`` /
``--env-kwarg`` (the main job's env by default: ``bench/env_args.py``), which the update does
not depend on.

    python bench/bench_update.py runs/main
    python bench/bench_update.py runs/main --micro-batch-tokens 1024 --gradient-checkpointing --steps 2,4
    python bench/bench_update.py runs/main --padded-defaults

One Spider step (B2 x G8, the LangGraph SQL agent on Spider's count questions, prompts of
~700-1,250 tokens of schema; docs/training.md, "The update and the rollout on Spider"):

    AGENTGYM_LIGHTNING_SPIDER_DIR=/work/shared/data/spider agentgym-lightning train \\
        --env bench/spider_counts.py:make_env --env-kwarg split=train --agent-match 'writer|rewriter' \\
        --air spider.executes=0.5 --steps 1 --tasks-per-step 2 --group-size 8 --learning-rate 2e-5 --set temperature=0.7 \\
        --set gradient_checkpointing=true --set micro_batch_tokens=1024 --seed 0 \\
        --output-dir runs/spider-b2g8 --no-wandb
    AGENTGYM_LIGHTNING_SPIDER_DIR=/work/shared/data/spider python bench/bench_update.py runs/spider-b2g8

(both updates with the run's 1,024-token micro-batches and gradient checkpointing: with the
config's defaults, 4,096 padded tokens and no checkpointing, a padded micro-batch of three
~1,300-token rows holds ~6 GB of activations. 1,024 nodes cut the tree inside a group and repeat
its ~1,000-token schema prompt: add ``--micro-batch-tokens 4096`` for the tree's own budget; on an
H100 that ran 1.09x the unique tokens instead of 2.83x; docs/training.md.)
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from env_args import add_env_arguments, env_of  # noqa: E402


def replay_config(run: str | Path, args: argparse.Namespace, path: str) -> dict[str, Any]:
    """The config of ``path``'s (``padded`` or ``tree``) replay of ``run``: the run's own (its
    newest checkpoint's), else the defaults on ``--env``; then the bench's flags."""
    from agentgym_lightning.training import LightningRLConfig
    from agentgym_lightning.training.checkpoint import find_checkpoint

    try:
        state = json.loads((find_checkpoint(run) / "trainer_state.json").read_text(encoding="utf-8"))
        config = {k: v for k, v in state["config"].items() if k in LightningRLConfig.field_names()}
    except FileNotFoundError:
        config = {}
    if args.env is not None or not config:
        config["env"], config["env_kwargs"] = env_of(args)
    if path == "padded" and args.padded_defaults:
        # the update before the tree: the config's own defaults, whatever the run set
        config.pop("micro_batch_tokens", None)
        config.pop("gradient_checkpointing", None)
    else:
        if args.micro_batch_tokens is not None:
            config["micro_batch_tokens"] = args.micro_batch_tokens
        if args.gradient_checkpointing is not None:
            config["gradient_checkpointing"] = args.gradient_checkpointing
    # The update trains the hf model whichever backend generated the rows: no generator to start
    # (a vllm run is replayed without vLLM), and none of its options.
    config.update(backend="hf", policy_kwargs={}, rollout_workers=0)
    return {**config, "output_dir": tempfile.mkdtemp(), "report_to": [], "progress": False, "packed_update": path == "tree"}


def child(args: argparse.Namespace) -> None:
    """One update of one step's rows in this process; prints its numbers as one JSON line."""
    import torch

    from agentgym_lightning.trajectory import load_trajectories
    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer

    if args.threads:
        torch.set_num_threads(args.threads)
    trainer = LightningRLTrainer(LightningRLConfig.from_dict(json.loads(Path(args.config_file).read_text(encoding="utf-8"))))
    # the rows as the run's train_step built them (episodes in seed order)
    batch = trainer.samples(sorted(load_trajectories(args.step_file), key=lambda t: t.seed or 0))
    if not batch.samples:
        sys.exit(f"{args.step_file} has no rows to train on (every group had zero variance)")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start, cpu = time.perf_counter(), time.process_time()
    metrics = trainer.update(batch)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    trainer.policy.close()
    print(json.dumps({
        "update_s": seconds, "update_cpu_s": cpu_seconds, "forward": metrics["update/tokens/forward"], "unique": metrics["update/tokens/unique"],
        "total": batch.stats["tokens/total"], "rows": batch.stats["rows"], "loss_tokens": batch.stats["loss_tokens"],
        "loss": metrics["loss"], "grad_norm": metrics["grad_norm"], "rss_before_update_mb": before,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", nargs="?", help="a training run's output dir (holds trajectories/step-*.jsonl)")
    parser.add_argument("--steps", default=None, help="the steps to replay, e.g. 2,3 (default: all)")
    parser.add_argument("--micro-batch-tokens", type=int, default=None, help="micro_batch_tokens of both updates (default: the run's)")
    parser.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=None,
                        help="both updates with (or without) gradient checkpointing (default: as the run)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--padded-defaults", action="store_true",
                        help="the padded update with the config's defaults (the update before the tree), not these flags")
    add_env_arguments(parser)  # only for a run without a checkpoint (else the run's env), or to override it
    parser.add_argument("--child", choices=["padded", "tree"], help=argparse.SUPPRESS)
    parser.add_argument("--step-file", help=argparse.SUPPRESS)
    parser.add_argument("--config-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if not args.run:
        parser.error("give a run's output dir (e.g. runs/main after make run)")
    files = sorted(Path(args.run, "trajectories").glob("step-*.jsonl"))
    if args.steps:
        wanted = {int(x) for x in args.steps.split(",")}
        files = [f for f in files if int(f.stem.removeprefix("step-")) in wanted]
    if not files:
        sys.exit(f"no trajectories/step-*.jsonl in {args.run}: run a training job first (make run)")
    from agentgym_lightning.training import LightningRLConfig

    config_files = {}
    for path in ("padded", "tree"):
        config = LightningRLConfig.from_dict(replay_config(args.run, args, path))  # checked here, once
        config_files[path] = Path(config.output_dir, "config.json")
        config_files[path].write_text(json.dumps(config.to_dict()), encoding="utf-8")
        print(f"{path}: {config.env} {config.env_kwargs} model={config.model} use_peft={config.use_peft} "
              f"micro_batch_tokens={config.micro_batch_tokens} gradient_checkpointing={config.gradient_checkpointing}")
    flags = ["--threads", str(args.threads)] if args.threads else []
    print(f"{'step':>4} {'path':>6} {'rows':>4} {'total':>6} {'unique':>6} {'forward':>7} {'fwd/uniq':>8} {'update s':>8} {'cpu s':>7} {'peak MB':>8} {'loss':>10} {'grad norm':>9}")
    results: dict[str, list[dict]] = {"padded": [], "tree": []}
    for file in files:
        for path in ("padded", "tree"):
            out = subprocess.run([sys.executable, __file__, "--child", path, "--step-file", str(file), "--config-file", str(config_files[path]), *flags],
                                 capture_output=True, text=True, check=False)
            if out.returncode != 0:
                sys.exit(f"the {path} update of {file} failed:\n{out.stderr[-3000:]}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            results[path].append(r)
            print(f"{file.stem[-4:]:>4} {path:>6} {r['rows']:>4.0f} {r['total']:>6.0f} {r['unique']:>6.0f} {r['forward']:>7.0f} "
                  f"{r['forward'] / r['unique']:>8.2f} {r['update_s']:>8.1f} {r['update_cpu_s']:>7.1f} {r['peak_rss_mb']:>8.0f} {r['loss']:>10.6f} {r['grad_norm']:>9.5f}",
                  flush=True)
    padded, tree = results["padded"], results["tree"]
    med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
    print(f"\nmedian update s: padded {med(padded, 'update_s'):.1f}, tree {med(tree, 'update_s'):.1f} "
          f"-> {med(padded, 'update_s') / med(tree, 'update_s'):.2f}x faster")
    print(f"median update CPU-s: padded {med(padded, 'update_cpu_s'):.1f}, tree {med(tree, 'update_cpu_s'):.1f} "
          f"-> {med(padded, 'update_cpu_s') / med(tree, 'update_cpu_s'):.2f}x less")
    print(f"median forward tokens: padded {med(padded, 'forward'):.0f}, tree {med(tree, 'forward'):.0f} "
          f"-> {med(padded, 'forward') / med(tree, 'forward'):.2f}x fewer")
    print(f"peak RSS (max over steps): padded {max(r['peak_rss_mb'] for r in padded):.0f} MB, tree {max(r['peak_rss_mb'] for r in tree):.0f} MB")
    worst = max(r["forward"] / r["unique"] for r in tree)
    print(f"tree forward / unique tokens: worst {worst:.3f} -> {'PASS' if worst <= 1.25 else 'FAIL'} (<= 1.25)")
    diff = max(abs(p["loss"] - t["loss"]) for p, t in zip(padded, tree))
    print(f"largest |loss padded - loss tree|: {diff:.2e}")


if __name__ == "__main__":
    main()
