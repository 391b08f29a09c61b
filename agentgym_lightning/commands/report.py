"""``agentgym-lightning report``: one self-contained HTML file of one or more training runs.

::

    agentgym-lightning report runs/main -o report.html
    agentgym-lightning report runs/seed0 runs/seed1 runs/seed2 -o seeds.html   # overlaid, mean and spread
    agentgym-lightning report runs/seed0 runs/seed1 --charts-dir docs/img/seeds  # also each chart as an SVG file

The file holds the curves, the collapse alarms, every step's episodes by GRPO group, and the last
step's and last evaluation's episodes call by call; it fetches nothing (no CDN), so it opens
anywhere and can be attached to an issue. ``train`` writes ``report.html`` in its output folder
at the end of a run. ``--charts-dir DIR`` also writes each chart as a standalone SVG file
(``heldout.svg``, ``reward.svg``...) for docs to show. The live version: ``agentgym-lightning
view``. See docs/viewer.md.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["register", "run"]


#: The command's name and its line in ``agentgym-lightning --help`` (read without registering it).
COMMAND = "report"
HELP = "write a training run's self-contained HTML report (curves, alarms, episodes call by call)"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``report`` subcommand."""
    p = subparsers.add_parser(
        "report",
        help=HELP,
        description=(__doc__ or "").split("\n\n")[0],
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="a train run's output folder (several are overlaid)")
    p.add_argument("--output", "-o", default="report.html", help="the HTML file to write (default: %(default)s)")
    p.add_argument(
        "--charts-dir", metavar="DIR", default=None,
        help="also write each chart as a standalone SVG file DIR/<name>.svg (heldout.svg, reward.svg, air.svg, time.svg...)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The ``report`` command: exit 0 when written, 2 when a run folder is missing."""
    from agentgym_lightning.viewer import write_charts, write_report

    try:
        size = write_report(args.runs, args.output)
        charts = write_charts(args.runs, args.charts_dir) if args.charts_dir else []
    except (FileNotFoundError, ImportError, OSError) as exc:
        print(f"agentgym-lightning report: {exc}", file=sys.stderr)
        return 2
    print(f"report: {args.output} ({size / 1024:.0f} KB)")
    if args.charts_dir:
        print(f"charts: {args.charts_dir}/ ({', '.join(p.name for p in charts) or 'none: no metrics logged yet'})")
    return 0
