"""``agentgym-lightning compare``: held-out evaluations compared task by task, with a sign test.

::

    agentgym-lightning compare warm.jsonl rl-step20.jsonl rl-step40.jsonl      # each against the first
    agentgym-lightning compare --pairs warm-s0.jsonl rl-s0.jsonl warm-s1.jsonl rl-s1.jsonl   # one pair a seed, pooled

Each file is an evaluation's episodes (``eval --output FILE``, or a run's ``eval/step-N.jsonl``)
of the same held-out tasks. For each model it prints the tasks both solved, the tasks it *won*
(solved more often than the base) and *lost*, and the exact sign test's p-value that it is no
better than the base; with ``--pairs`` also the pairs pooled (seeds as independent draws). See
docs/metrics.md, "Comparing two evaluations".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentgym_lightning.training.paired_comparison import PairedComparison

__all__ = ["register", "run"]

#: The command's name and its line in ``agentgym-lightning --help`` (read without registering it).
COMMAND = "compare"
HELP = "compare held-out evaluations task by task (won, lost, the sign test's p-value)"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``compare`` subcommand."""
    p = subparsers.add_parser("compare", help=HELP, description=(__doc__ or "").split("\n\n")[0])
    p.add_argument(
        "files", nargs="+", metavar="FILE",
        help="evaluation episode files (eval --output, RUN/eval/step-N.jsonl): the base, then the models",
    )
    p.add_argument(
        "--pairs", action="store_true",
        help="read FILE as BASE MODEL pairs (one a seed) and pool them, instead of every model against the first file",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object a comparison (the pooled one last)")
    p.set_defaults(func=run)


def _load(path: str) -> list:
    from agentgym_lightning.trajectory import load_trajectories

    if Path(path).is_dir():
        raise FileNotFoundError(
            f"{path} is a folder: give an evaluation's episode file (`eval --output FILE`, or a run's eval/step-N.jsonl)"
        )
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: no such evaluation file")
    return list(load_trajectories(path))


def _line(name: str, c: PairedComparison) -> str:
    gain = c.model_solved - c.base_solved
    text = (
        f"{name}: {c.base_solved:g} -> {c.model_solved:g} of {c.tasks} ({gain:+g}); won {c.won}, lost {c.lost}; "
        f"sign test p = {c.p_better:.3g} (one-sided: the model better; two-sided {c.p_different:.3g})"
    )
    if c.only_base or c.only_model:
        text += f"; not compared: {c.only_base} task(s) only in the base, {c.only_model} only in the model"
    return text


def run(args: argparse.Namespace) -> int:
    """The ``compare`` command: exit 0 when compared, 2 when a file is missing, unreadable or shares no task."""
    from agentgym_lightning.training.paired_comparison import compare_paired, pool

    files = list(args.files)
    if len(files) < 2 or (args.pairs and len(files) % 2):
        want = "BASE MODEL pairs (an even count)" if args.pairs else "a base and at least one model"
        print(f"agentgym-lightning compare: got {len(files)} file(s); give {want}", file=sys.stderr)
        return 2
    pairs = list(zip(files[::2], files[1::2])) if args.pairs else [(files[0], f) for f in files[1:]]
    try:
        loaded = {f: _load(f) for f in files}
        results = [(f"{base} -> {model}", compare_paired(loaded[base], loaded[model])) for base, model in pairs]
    except (FileNotFoundError, ValueError) as exc:
        print(f"agentgym-lightning compare: {exc}", file=sys.stderr)
        return 2
    if args.pairs and len(results) > 1:
        results.append((f"pooled ({len(results)} pairs)", pool([c for _, c in results])))
    for name, c in results:
        if args.json:
            row = {"name": name, **{k: getattr(c, k) for k in c.__dataclass_fields__}, "p_better": c.p_better, "p_different": c.p_different}
            print(json.dumps(row))
        else:
            print(_line(name, c))
    return 0
