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
from pathlib import Path
from typing import Any

from agentgym_lightning.envs.gold import GoldCounts, check_train_split, gold_main, recipe_env_kwargs, scripted_episodes, write_solved_episodes
from agentgym_lightning.trajectory import Trajectory

from .env import gold_policy, make_env

__all__ = ["gold_episodes", "write_gold_episodes", "recipe_env_kwargs", "main"]


def gold_episodes(env_kwargs: Mapping[str, Any], episodes: int | None = None, seed: int = 0) -> Iterator[Trajectory]:
    """Episodes of ``episodes`` questions (all when ``None``) of the env ``make_env(**env_kwargs)``
    (``split`` must be ``train``), in a seeded order, each answered with its gold SQL."""
    check_train_split(env_kwargs, "dev", "the dev databases are held out")
    return scripted_episodes(make_env(**dict(env_kwargs)), gold_policy, episodes, seed)


def write_gold_episodes(path: str | Path, env_kwargs: Mapping[str, Any], episodes: int | None = None, seed: int = 0) -> GoldCounts:
    """Write the :func:`gold_episodes` that scored 1 (all should) to ``path`` (JSONL); returns how
    many were written and how many skipped."""
    return write_solved_episodes(path, gold_episodes(env_kwargs, episodes, seed))


def main(argv: list[str] | None = None) -> int:
    return gold_main(argv, name="spider", description=__doc__.split("\n\n")[0], example_recipe="recipes/spider.yaml",
                     write=write_gold_episodes)


if __name__ == "__main__":
    sys.exit(main())
