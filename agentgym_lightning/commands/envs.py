"""``agentgym-lightning envs``: the registered environment ids."""

from __future__ import annotations

import argparse
from typing import Any


#: The command's name and its line in ``agentgym-lightning --help`` (read without registering it).
COMMAND = "envs"
HELP = "list the registered lightning/... environments"


def register(sub: Any) -> None:
    p = sub.add_parser("envs", help=HELP)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import gymnasium as gym

    from agentgym_lightning.registration import lightning_env_ids

    for env_id in lightning_env_ids():
        print(f"{env_id:<32} {gym.registry[env_id].entry_point}")
    return 0
