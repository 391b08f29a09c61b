"""``agentgym-lightning data ...``: fetchless data management (import and validate local downloads).

Each data set contributes a subcommand: ``data spider PATH`` (see
``agentgym_lightning.envs.spider.cli``), ``data musique PATH`` and ``data hotpotqa PATH`` (see
``agentgym_lightning.envs.rag.cli``).
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``data`` command and its per-data-set subcommands."""
    parser = subparsers.add_parser(
        "data",
        help="import and validate data sets you downloaded (Spider, MuSiQue, HotpotQA)",
        description="Import and validate data sets you downloaded, for the bundled environments.",
    )
    sub = parser.add_subparsers(dest="data_command", metavar="DATASET")
    from agentgym_lightning.envs.spider.cli import register_data_command

    register_data_command(sub)
    from agentgym_lightning.envs.rag.cli import register_data_commands

    register_data_commands(sub)
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])
