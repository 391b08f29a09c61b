"""``agentgym-lightning calls``: examples of an agent's calls at some steps of a run, as text.

::

    agentgym-lightning calls runs/spider --steps 1 40 --agent writer -n 3   # before / after, to quote
    agentgym-lightning calls runs/spider --steps 0 40 --eval                # held-out episodes

For each step it prints up to N calls chosen by a fixed rule (one episode of each GRPO group in
turn, its first call of the agent): the call's last user message, the policy's answer, what the
agent emitted after it (its outcome), the call's rewards and its episode's final reward. Any env. See docs/viewer.md.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["register", "run"]

#: The command's name and its line in ``agentgym-lightning --help`` (read without registering it).
COMMAND = "calls"
HELP = "print examples of an agent's calls at some steps of a run (to quote what its behaviour became)"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``calls`` subcommand."""
    p = subparsers.add_parser("calls", help=HELP, description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("run", metavar="RUN", help="a train run's output folder")
    p.add_argument("--steps", nargs="+", type=int, required=True, metavar="STEP", help="the steps whose calls to print (e.g. 1 40)")
    p.add_argument("-n", "--count", type=int, default=3, help="calls per step (default: %(default)s)")
    p.add_argument("--agent", default=None, help="only calls of this agent or role (a LangGraph node, an agent's name)")
    p.add_argument("--eval", action="store_true", help="the held-out evaluations after those steps instead of training steps")
    p.add_argument("--limit", type=int, default=400, help="characters kept of each message and answer (default: %(default)s)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The ``calls`` command: exit 0 when printed, 2 when the run or a step's file is missing."""
    from agentgym_lightning.viewer.calls import call_examples, format_examples
    from agentgym_lightning.viewer.run import RunFolder

    kind = "eval" if args.eval else "train"
    try:
        folder = RunFolder(args.run)
        found = [call_examples(folder, step, count=args.count, agent=args.agent, kind=kind, limit=args.limit) for step in args.steps]
    except (FileNotFoundError, KeyError) as exc:
        print(f"agentgym-lightning calls: {exc.args[0] if isinstance(exc, KeyError) else exc}", file=sys.stderr)
        return 2
    for step, examples in zip(args.steps, found):
        print(f"=== {'evaluation after step' if args.eval else 'step'} {step}: {len(examples)} call(s)" + (f" of {args.agent}" if args.agent else ""))
        print(format_examples(examples) if examples else "(no call" + (f" of {args.agent}" if args.agent else "") + " in this file)")
        print()
    return 0
