"""``agentgym-lightning data ...``: fetchless data management (import and validate local downloads).

Each data set contributes a subcommand: ``data spider PATH`` (see
``agentgym_lightning.envs.spider.cli``), ``data musique PATH`` and ``data hotpotqa PATH`` (see
``agentgym_lightning.envs.rag.cli``), ``data gsm8k PATH`` and ``data calcx PATH`` (see
``agentgym_lightning.envs.math.cli``).
"""

from __future__ import annotations

import argparse


#: The command's name and its line in ``agentgym-lightning --help`` (read without registering it).
COMMAND = "data"
HELP = "import and validate data sets you downloaded (Spider, MuSiQue, HotpotQA, GSM8K, Calc-X)"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``data`` command and its per-data-set subcommands."""
    parser = subparsers.add_parser(
        "data",
        help=HELP,
        description="Import and validate data sets you downloaded, for the bundled environments.",
    )
    sub = parser.add_subparsers(dest="data_command", metavar="DATASET")
    from agentgym_lightning.envs.math.cli import register_data_commands as register_math_commands
    from agentgym_lightning.envs.rag.cli import register_data_commands as register_rag_commands
    from agentgym_lightning.envs.spider.cli import register_data_command as register_spider_command

    register_spider_command(sub)
    register_rag_commands(sub)
    register_math_commands(sub)
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])
