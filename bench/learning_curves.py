"""Learning curves: the same `agentgym-lightning train` run over several seeds and variants.

Each (variant, seed) is one ``train`` process writing ``<out>/<variant>-s<seed>/metrics.jsonl``;
this script runs them (``--parallel`` at once), then prints the held-out reward at every
evaluation, per run and as the mean over seeds, with the wall time of each run, and writes
``<out>/curves.json``. It is how the README's main-job numbers and the GPU curves were measured::

    python bench/learning_curves.py --out /tmp/curves --seeds 0 1 2 \\
        --variant task= --variant air="--air math.calc_ok=0.1,math.answer_missing=-0.5" \\
        -- --config configs/main.yaml

Everything after ``--`` goes to every run; a variant's own arguments follow it. With
``--threads N`` each process runs torch on N threads (``OMP_NUM_THREADS`` and the config's
``num_threads``), so parallel CPU runs do not fight over cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any


def _read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a run killed mid-write leaves a partial last line
            continue
    return rows


def curve(rows: list[dict[str, Any]], key: str) -> dict[int, float]:
    """``{step: value}`` of one metric (the last value logged at each step)."""
    return {int(r["step"]): float(r[key]) for r in rows if r.get(key) is not None}


def run_one(name: str, seed: int, args: list[str], out: Path, threads: int | None, log: Path) -> dict[str, Any]:
    run_dir = out / f"{name}-s{seed}"
    cmd = [sys.executable, "-m", "agentgym_lightning", "train", *args, "--seed", str(seed),
           "--output-dir", str(run_dir), "--no-progress", "--json"]
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
        cmd += ["--set", f"num_threads={threads}"]
    start = time.perf_counter()
    with log.open("w", encoding="utf-8") as fh:
        fh.write(shlex.join(cmd) + "\n")
        fh.flush()
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
    wall = time.perf_counter() - start
    rows = _read_metrics(run_dir / "metrics.jsonl")
    return {
        "variant": name, "seed": seed, "returncode": proc.returncode, "wall_s": round(wall, 1),
        "eval": curve(rows, "eval/reward/mean"), "train": curve(rows, "train/reward/mean"),
        "step_s": curve(rows, "time/step_s"), "rollout_s": curve(rows, "time/rollout_s"),
        "update_s": curve(rows, "time/update_s"),
    }


def print_table(results: list[dict[str, Any]]) -> None:
    steps = sorted({s for r in results for s in r["eval"]})
    print("held-out reward (greedy) at step: " + " ".join(f"{s:>6}" for s in steps) + "   wall_s  rc")
    for r in results:
        cells = " ".join(f"{r['eval'][s]:6.3f}" if s in r["eval"] else "     -" for s in steps)
        print(f"{r['variant']:>16} seed {r['seed']:<3}          {cells}   {r['wall_s']:6.0f}  {r['returncode']}")
    for name in dict.fromkeys(r["variant"] for r in results):
        runs = [r for r in results if r["variant"] == name]
        cells = []
        for s in steps:
            vals = [r["eval"][s] for r in runs if s in r["eval"]]
            cells.append(f"{statistics.fmean(vals):6.3f}" if vals else "     -")
        print(f"{name:>16} mean of {len(runs)}          " + " ".join(cells))
        deltas = [r["eval"][max(r["eval"])] - r["eval"][min(r["eval"])] for r in runs if len(r["eval"]) >= 2]
        if deltas:
            print(f"{name:>16} after - before: " + ", ".join(f"{d:+.3f}" for d in deltas)
                  + f"  (mean {statistics.fmean(deltas):+.3f})")
        step_s = [v for r in runs for v in r["step_s"].values()]
        if step_s:
            print(f"{name:>16} seconds per step: median {statistics.median(step_s):.1f}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    common: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, common = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path, help="folder of the runs and curves.json")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--variant", action="append", default=[], metavar="NAME=ARGS",
                   help="a named variant and its own train arguments (repeatable; default: one variant 'run')")
    p.add_argument("--parallel", type=int, default=1, help="runs at once")
    p.add_argument("--threads", type=int, default=None, help="torch/OpenMP threads per run")
    args = p.parse_args(argv)
    variants: list[tuple[str, list[str]]] = []
    for spec in args.variant or ["run="]:
        name, sep, rest = spec.partition("=")
        if not sep or not name:
            p.error(f"--variant takes NAME=ARGS, got {spec!r}")
        variants.append((name, shlex.split(rest)))
    args.out.mkdir(parents=True, exist_ok=True)
    jobs = [(name, seed, common + extra) for name, extra in variants for seed in args.seeds]
    print(f"{len(jobs)} runs, {args.parallel} at once; logs in {args.out}/<variant>-s<seed>.log", flush=True)
    with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
        futures = [pool.submit(run_one, name, seed, extra, args.out, args.threads, args.out / f"{name}-s{seed}.log")
                   for name, seed, extra in jobs]
        results = []
        for future in futures:
            results.append(future.result())
            r = results[-1]
            print(f"done {r['variant']} seed {r['seed']}: rc {r['returncode']}, {r['wall_s']:.0f} s, eval {r['eval']}",
                  flush=True)
    (args.out / "curves.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    print_table(results)
    return 0 if all(r["returncode"] == 0 for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
