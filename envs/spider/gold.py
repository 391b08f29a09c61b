"""Gold-SQL episodes of Spider's train databases: SFT data to warm-start a student before RL.

A 135M model writes almost no correct SQL on its own, so RL on Spider starts with groups that
carry no reward variance. The standard remedy is a supervised warm start on correct episodes;
Spider has them for free: every train question comes with its gold query. This module plays the
env's scripted :func:`~agentgym_lightning.envs.spider.env.gold_policy` through the agent (the
writer answers with the gold query in the ```` ```sql ```` block the agent parses; the checker
accepts it) on train questions, and writes those that scored 1 (all should) as trajectory JSONL::

    python -m agentgym_lightning.envs.spider.gold --config recipes/spider.yaml --episodes 256 --output runs/spider-gold.jsonl
    agentgym-lightning sft runs/spider-gold.jsonl --config recipes/sft/spider.yaml     # make sft-spider

The calls are recorded as text (a scripted policy has no tokens), so ``sft`` tokenizes them once
with the student's chat template (``retokenize: auto``; each row says so), exactly as it does a
teacher's. Only the env options of ``--config`` are read (``env_kwargs``: the train split, the
subset, the agent), so the gold episodes are of the questions RL trains on, never the held-out ones.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from typing import Any

from agentgym_lightning.envs.gold import check_train_split, gold_command, scripted_episodes
from agentgym_lightning.trajectory import Trajectory

from .env import gold_policy, make_env

__all__ = ["gold_episodes", "main"]


def gold_episodes(env_kwargs: Mapping[str, Any], episodes: int | None = None, seed: int = 0) -> Iterator[Trajectory]:
    """Episodes of ``episodes`` questions (all when ``None``) of the env ``make_env(**env_kwargs)``
    (``split`` must be ``train``), in a seeded order, each answered with its gold SQL."""
    check_train_split(env_kwargs, "dev", "the dev databases are held out")
    return scripted_episodes(make_env(**dict(env_kwargs)), gold_policy, episodes, seed)


#: ``main(argv) -> exit status``: the command line of the module docstring.
main = gold_command("spider", __doc__, gold_episodes)

if __name__ == "__main__":
    sys.exit(main())
