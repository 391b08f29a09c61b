"""The env a bench runs: ``--env`` and ``--env-kwarg`` flags, the main job's env by default.

    --env lightning/Spider-v0 --env-kwarg agent=langgraph --env-kwarg split=train
    --env bench/spider_counts.py:make_env --env-kwarg split=train

Without ``--env`` a bench runs the main job's (``make run``) ``lightning/Arithmetic-v0`` at
difficulty 3 with one worked example; ``--env-kwarg`` then overrides those kwargs. With ``--env``
only the kwargs given apply (the env's own defaults for the rest). Values are JSON when they
parse (``3``, ``true``), as ``agentgym-lightning train --env-kwarg`` reads them.
"""

from __future__ import annotations

import argparse
from typing import Any

#: The main job's env and kwargs (the Makefile's RUN_ARGS).
MAIN_JOB_ENV = "lightning/Arithmetic-v0"
MAIN_JOB_ENV_KWARGS: dict[str, Any] = {"difficulty": 3, "examples": 1}


def add_env_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--env`` and the repeatable ``--env-kwarg KEY=VALUE`` to ``parser``."""
    parser.add_argument("--env", default=None,
                        help=f"env id or path/to/file.py:make_env (default: the main job's {MAIN_JOB_ENV}, "
                             + ", ".join(f"{k}={v}" for k, v in MAIN_JOB_ENV_KWARGS.items()) + ")")
    parser.add_argument("--env-kwarg", action="append", default=[], metavar="KEY=VALUE",
                        help="env keyword argument (repeatable; JSON values)")


def env_of(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The env id (or file factory) and kwargs that ``args`` name (see the module docstring)."""
    from agentgym_lightning.commands.eval import parse_kwargs

    given = parse_kwargs(args.env_kwarg, "--env-kwarg")
    if args.env is None:
        return MAIN_JOB_ENV, {**MAIN_JOB_ENV_KWARGS, **given}
    return args.env, given


def env_flags(env: str, env_kwargs: dict[str, Any]) -> list[str]:
    """``env`` and ``env_kwargs`` as the flags that :func:`env_of` reads back (for a child process)."""
    import json

    return ["--env", env, *(f"--env-kwarg={k}={json.dumps(v)}" for k, v in env_kwargs.items())]
