"""How often a two-rank gloo run aborts at its exit, with and without waiting for gloo's workers.

Each run starts 2 CPU ranks through torch's elastic launcher: FSDP2 over a small MLP, three rounds
of what a follower does (a ``broadcast_object_list`` command, a forward and backward, every
parameter gathered whole), then the end :class:`~agentgym_lightning.training.ranks.Ranks` makes: a
barrier and ``destroy_process_group``, and in the ``settle`` case
:func:`~agentgym_lightning.training.ranks.settle_gloo_workers`. A run whose launcher exits non-zero
aborted at its exit ("terminate called without an active exception", SIGABRT): a gloo worker still
letting go of a collective's tensors while the interpreter finalized. It prints, per case, the runs
that aborted and the ratio of the two cases' abort rates. The cases alternate, so load on the
machine falls on both alike. The abort is a race: expect a few in 40 without the wait on a busy
2-core machine, and fewer, or none, on an idle one.

    python bench/bench_rank_exit.py              # 40 runs a case (about 4 minutes on 2 cores)
    python bench/bench_rank_exit.py --runs 100
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]

RANK_SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    # imported in both cases, before the work: an import after the destroy would be a wait too
    from agentgym_lightning.training.ranks import settle_gloo_workers

    dist.init_process_group("gloo")
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    for _ in range(3):
        box = [("update", list(range(100)))] if dist.get_rank() == 0 else [None]
        dist.broadcast_object_list(box, src=0)
        model(torch.randn(8, 64)).sum().backward()
        for param in model.parameters():
            param.full_tensor()
    dist.barrier()
    dist.destroy_process_group()
    if sys.argv[1] == "settle":
        settle_gloo_workers()
    """
)


def run_once(script: Path, case: str) -> bool:
    """Whether one two-rank run of ``case`` exited cleanly."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script), case]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    return done.returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=40, help="runs of each case")
    args = parser.parse_args()
    aborted = {"destroy": 0, "settle": 0}
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "ranks.py"
        script.write_text(RANK_SCRIPT)
        for _ in tqdm(range(args.runs), desc="runs of each case"):
            for case in aborted:
                aborted[case] += not run_once(script, case)
    for case, count in aborted.items():
        print(f"{case:>8}: {count} of {args.runs} runs aborted at exit")
    if aborted["settle"]:
        print(f"abort rate, destroy only / with settle: {aborted['destroy'] / aborted['settle']:.1f}")
    else:
        print(f"abort rate, destroy only / with settle: {aborted['destroy']} / 0 (none aborted with the wait)")


if __name__ == "__main__":
    main()
