"""``agentgym-lightning pass-rates``: a task file from episodes a run already has, no new sampling.

::

    agentgym-lightning pass-rates runs/math-s0 --output pool.jsonl
    agentgym-lightning train --config recipes/math.yaml --set task_file=pool.jsonl \\
        --set curriculum_min_attempts=8 --set curriculum_min_pass_rate=0.01 --set curriculum_max_pass_rate=0.99

Every task of the sources (run folders: their ``trajectories/``, the groups a step trained on and
those dynamic sampling set aside, and ``rollouts/``; never ``eval/``, the held-out episodes; or
trajectory files such as ``eval --output``; or task files, whose counts are added, so slices
measured apart, or a pool measured twice, merge into one) becomes one line of a task file with its attempts and
successes, what ``eval --pass-rates`` writes after sampling anew. A run's counts span the policies
of its steps; for one policy's pass rates, ``eval --group-size k --pass-rates``. With
``--keys-only`` the lines name each task by its key alone (``train`` looks it up among its env's
tasks): a pool that copies no dataset text. See docs/training.md, "Groups with signal".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["register", "run"]

#: The command's name and its line in ``agentgym-lightning --help`` (read without registering it).
COMMAND = "pass-rates"
HELP = "write a task file (each task's attempts and successes) from the episodes of runs or trajectory files"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``pass-rates`` subcommand."""
    p = subparsers.add_parser("pass-rates", help=HELP, description=(__doc__ or "").split("\n\n")[0])
    p.add_argument(
        "sources", nargs="+", metavar="SOURCE",
        help="a run folder (never its eval/), a trajectory JSONL file, or a task file (its counts are added: task files merge)",
    )
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the task file to write (JSONL; `train --set task_file=FILE` takes it)")
    p.add_argument(
        "--keys-only", action="store_true",
        help="name each task by its key alone, no task text (a pool to keep in a repository without copying the "
        "dataset); `train` looks the keys up among its env's tasks, so it must be given the same env options",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The ``pass-rates`` command: exit 0 when written, 2 when a source is missing or holds no
    episodes, or the output cannot be written."""
    from agentgym_lightning.training.episode_sources import load_sources
    from agentgym_lightning.training.pass_rates import is_task_file, read_task_counts, write_pass_rates

    # Task files (their counts) merge with the episodes' counts; every other source is read for episodes.
    task_files = [s for s in args.sources if Path(s).is_file() and is_task_file(s)]
    try:
        counted = [row for path in task_files for row in read_task_counts(path)]
        others = [s for s in args.sources if s not in task_files]
        episodes = load_sources(others) if others else []
    except (FileNotFoundError, ValueError) as exc:  # a bad line or a run file refused: named in the message
        print(f"agentgym-lightning pass-rates: {exc}", file=sys.stderr)
        return 2
    if not episodes and not counted:
        print(f"agentgym-lightning pass-rates: no episodes or task counts in {' '.join(args.sources)}", file=sys.stderr)
        return 2
    try:
        rows = write_pass_rates(args.output, episodes, keys_only=args.keys_only, counted=counted)
    except ValueError as exc:  # a task known by its key alone, written with its text
        print(f"agentgym-lightning pass-rates: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"agentgym-lightning pass-rates: --output {args.output} cannot be written: {exc.strerror or exc}", file=sys.stderr)
        return 2
    judged = [r for r in rows if r["attempts"]]
    never = sum(1 for r in judged if r["successes"] == 0)
    always = sum(1 for r in judged if r["successes"] == r["attempts"])
    print(
        f"wrote {args.output}: {len(rows)} task(s) from {len(episodes)} episode(s)"
        + (f" and {len(task_files)} task file(s)" if task_files else "")
        + "; "
        f"{len(judged) - never - always} solved sometimes, {always} always, {never} never"
        + (f", {len(rows) - len(judged)} with no judged attempt" if len(rows) > len(judged) else "")
    )
    return 0
