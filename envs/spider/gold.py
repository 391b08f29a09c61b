"""Gold-SQL episodes of Spider's train databases: SFT data to warm-start a student before RL.

A 135M model writes almost no correct SQL on its own, so RL on Spider starts with groups that
carry no reward variance. The standard remedy is a supervised warm start on correct episodes;
Spider has them for free: every train question comes with its gold query. This module plays the
env's scripted :func:`~agentgym_lightning.envs.spider.env.gold_policy` through the agent (the
writer answers with the gold query in the ```` ```sql ```` block the agent parses; the checker
accepts it) on train questions, and writes the episodes as trajectory JSONL::

    python -m agentgym_lightning.envs.spider.gold --config recipes/spider.yaml --episodes 256 --output runs/spider-gold.jsonl
    agentgym-lightning sft runs/spider-gold.jsonl --config recipes/sft/spider.yaml     # make sft-spider

The calls are recorded as text (a scripted policy has no tokens), so ``sft`` tokenizes them once
with the student's chat template (``retokenize: auto``; each row says so), exactly as it does a
teacher's. Only the env options of ``--config`` are read (``env_kwargs``: the train split, the
subset, the agent), so the gold episodes are of the questions RL trains on, never the held-out ones.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from agentgym_lightning.trajectory import Trajectory, TrajectoryWriter

from .env import gold_policy, make_env

__all__ = ["gold_episodes", "write_gold_episodes", "recipe_env_kwargs", "main"]


def recipe_env_kwargs(path: str | Path) -> dict[str, Any]:
    """The training env's keyword arguments of a ``train --config`` recipe (its ``env_kwargs``)."""
    import yaml

    data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    if not isinstance(data, Mapping):
        raise ValueError(f"{path} must hold a mapping of option: value")
    return dict(data.get("env_kwargs") or {})


def gold_episodes(env_kwargs: Mapping[str, Any], episodes: int | None = None, seed: int = 0) -> Iterator[Trajectory]:
    """Episodes of ``episodes`` questions (all when ``None``) of the env ``make_env(**env_kwargs)``
    (``split`` must be ``train``), in a seeded order, each answered with its gold SQL."""
    if env_kwargs.get("split", "dev") != "train":
        raise ValueError(f"gold episodes are for training: use split 'train' (got {env_kwargs.get('split', 'dev')!r}); the dev databases are held out")
    env = make_env(**dict(env_kwargs))
    try:
        order = np.random.default_rng(seed).permutation(len(env.tasks))
        for index in order[: episodes if episodes is not None else len(order)]:
            obs, info = env.reset(options={"task_index": int(index)})
            task, done = info["task"], False
            while not done:
                obs, _, terminated, truncated, info = env.step(gold_policy(obs, task))
                done = terminated or truncated
            yield info["trajectory"]
    finally:
        env.close()


def write_gold_episodes(path: str | Path, env_kwargs: Mapping[str, Any], episodes: int | None = None, seed: int = 0) -> int:
    """Write :func:`gold_episodes` to ``path`` (JSONL); returns how many scored 1 (all should)."""
    solved = 0
    with TrajectoryWriter(path) as writer:
        for trajectory in gold_episodes(env_kwargs, episodes, seed):
            writer.write(trajectory)
            solved += int((trajectory.final_reward or 0.0) >= 1.0)
    return solved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentgym_lightning.envs.spider.gold", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", metavar="FILE.yaml", help="a train recipe whose env_kwargs to use (recipes/spider.yaml)")
    parser.add_argument("--env-kwarg", action="append", default=[], metavar="KEY=VALUE", help="env keyword argument (repeatable; JSON values)")
    parser.add_argument("--episodes", type=int, default=None, help="how many train questions (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="the questions' order")
    parser.add_argument("--output", required=True, help="the trajectory JSONL to write")
    args = parser.parse_args(argv)
    import json

    kwargs = recipe_env_kwargs(args.config) if args.config else {"split": "train"}
    for item in args.env_kwarg:
        key, _, value = item.partition("=")
        try:
            kwargs[key] = json.loads(value)
        except ValueError:
            kwargs[key] = value
    try:
        solved = write_gold_episodes(args.output, kwargs, args.episodes, args.seed)
    except ValueError as exc:
        print(f"spider gold: {exc}", file=sys.stderr)
        return 2
    print(f"{args.output}: {solved} gold episodes scored 1")
    return 0


if __name__ == "__main__":
    sys.exit(main())
