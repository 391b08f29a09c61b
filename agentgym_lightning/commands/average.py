"""``agentgym-lightning average``: several checkpoints' weights averaged into one model folder.

::

    agentgym-lightning average RUN/checkpoints/checkpoint-000040 RUN/checkpoints/checkpoint-000050 --output RUN-avg
    agentgym-lightning average A B C --weights 1 1 2 --output soup     # a weighted mean
    agentgym-lightning eval --model RUN-avg ...

Each SOURCE is a run folder, a ``final/`` folder or one checkpoint folder (what ``init_from``
takes); their full weights must be of one model. The output is a model folder (the first source's
config and tokenizer, ``averaged_from.json`` naming the sources) that ``eval --model`` and
``train --init-from`` take. See docs/training.md, "Averaging checkpoints".
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["register", "run"]

#: The command's name and its line in ``agentgym-lightning --help`` (read without registering it).
COMMAND = "average"
HELP = "average several checkpoints' weights into one model folder (checkpoint averaging)"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``average`` subcommand."""
    p = subparsers.add_parser("average", help=HELP, description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="run folders, final/ folders or checkpoint folders (at least two)")
    p.add_argument("--output", "-o", required=True, help="the new model folder to write (must not exist)")
    p.add_argument(
        "--weights", nargs="+", type=float, metavar="W",
        help="one non-negative weight a source, normalised to sum to one (default: a uniform mean)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The ``average`` command: exit 0 when written, 2 when a source is missing, corrupt, LoRA or of another model."""
    from agentgym_lightning.training.weight_average import average_weights

    try:
        folder = average_weights(args.sources, args.output, weights=args.weights, progress=not args.no_progress)
    except (FileNotFoundError, ValueError) as exc:  # CorruptCheckpointError is a ValueError
        print(f"agentgym-lightning average: {exc}", file=sys.stderr)
        return 2
    print(f"averaged {len(args.sources)} checkpoints into {folder}")
    return 0
