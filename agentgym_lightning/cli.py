"""The ``agentgym-lightning`` command (also ``python -m agentgym_lightning``).

Each subcommand lives in its own module exposing ``register(subparsers)``, which adds its
parser and sets ``func`` to a callable ``func(args) -> int``, and ``COMMAND`` / ``HELP``, its
name and its line in the help screen. A command line registers only the command it runs (its
options import what the command needs: the trainer's config, the data sets' modules); the others
are listed by ``HELP`` alone, so ``agentgym-lightning --help`` imports none of them.
Torch's idle threads sleep (``OMP_WAIT_POLICY=PASSIVE``): the package's import, which runs
before this module, sets it (:mod:`agentgym_lightning.cpu_threads`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: Modules that contribute subcommands, in the order ``--help`` lists them.
COMMAND_MODULES: tuple[str, ...] = (
    "agentgym_lightning.commands.plugins",
    "agentgym_lightning.commands.envs",
    "agentgym_lightning.commands.eval",
    "agentgym_lightning.commands.train",
    "agentgym_lightning.commands.optimize_prompt",
    "agentgym_lightning.commands.sft",
    "agentgym_lightning.commands.serve",
    "agentgym_lightning.commands.report",
    "agentgym_lightning.commands.calls",
    "agentgym_lightning.commands.pass_rates",
    "agentgym_lightning.commands.compare",
    "agentgym_lightning.commands.average",
    "agentgym_lightning.commands.view",
    "agentgym_lightning.commands.data",
)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command's parser. ``command``: register only that subcommand in full and list the
    others by their ``HELP`` (``""``: list them all); ``None``: register every one."""
    from agentgym_lightning import __version__

    parser = argparse.ArgumentParser(
        prog="agentgym-lightning",
        description="Train any LLM agent with RL: every agent is a Gymnasium env, one LLM call per step.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        module = importlib.import_module(name)
        listed = getattr(module, "COMMAND", None)
        if command is None or listed is None or listed == command:
            module.register(sub)
        else:
            sub.add_parser(listed, help=module.HELP, add_help=False)
    return parser


def _command_in(argv: Sequence[str]) -> str:
    """The subcommand named in ``argv`` (the top level takes no option with a value), or ``""``."""
    return next((a for a in argv if not a.startswith("-")), "")


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command_in(argv))
    args = parser.parse_args(argv)
    args.argv = argv  # what was asked (train --nproc-per-node runs it again on every rank)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
