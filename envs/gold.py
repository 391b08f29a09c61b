"""Gold episodes, shared by the bundled envs: a scripted policy that knows each task's answer,
played through the env's real agent on the train split, written as trajectory JSONL for ``sft``.

A small model that never succeeds gives RL groups without reward variance; a supervised warm start
on correct episodes breaks that wall, and data sets with gold solutions give them for free. An env
supplies ``make_env`` and a ``policy(observation, task) -> action`` (Spider: the gold SQL,
:mod:`agentgym_lightning.envs.spider.gold`; GSM8K: the gold calculations and answer,
:mod:`agentgym_lightning.envs.math.gold`; HotpotQA: a search per supporting passage and the answer,
:mod:`agentgym_lightning.envs.rag.gold`); this module plays it, keeps the episodes that scored 1
and makes the ``python -m ...gold`` command line of each.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agentgym_lightning.llm import Completion, ToolCall
from agentgym_lightning.policies.tool_calls import new_tool_call_id
from agentgym_lightning.trajectory import Trajectory, TrajectoryWriter

__all__ = ["GoldCounts", "recipe_env_kwargs", "check_train_split", "scripted_tool_turn", "scripted_episodes", "write_solved_episodes",
           "gold_command"]


@dataclass(frozen=True)
class GoldCounts:
    """What :func:`write_solved_episodes` did: episodes written (each scored 1), and skipped (not)."""

    written: int
    skipped: int


def recipe_env_kwargs(path: str | Path) -> dict[str, Any]:
    """The training env's keyword arguments of a ``train --config`` recipe (its ``env_kwargs``)."""
    import yaml

    data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    if not isinstance(data, Mapping):
        raise ValueError(f"{path} must hold a mapping of option: value")
    return dict(data.get("env_kwargs") or {})


def check_train_split(env_kwargs: Mapping[str, Any], default_split: str, held_out: str) -> None:
    """Refuse gold episodes of any split but ``train`` (``default_split``: the env's own default;
    ``held_out`` says what the other splits are, for the message)."""
    split = env_kwargs.get("split", default_split)
    if split != "train":
        raise ValueError(f"gold episodes are for training: use split 'train' (got {split!r}); {held_out}")


def scripted_tool_turn(observation: Any, tool: str, arguments: Sequence[Mapping[str, Any]], answer: str) -> Completion | str:
    """One turn of a scripted ``tools`` policy that calls ``tool`` with each of ``arguments`` in
    turn, one call a turn, then replies ``answer``: the tool results after the last user message
    (the task; worked examples come before it, each with its own results) say how many calls were
    made. A call offered no tools (AutoGen's reflection after its last tool round) answers."""
    messages = observation.request.messages
    task = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    made = sum(1 for m in messages[task + 1:] if m.get("role") == "tool")
    if made < len(arguments) and observation.request.tools:
        call = ToolCall(id=new_tool_call_id(), name=tool, arguments=json.dumps(dict(arguments[made])))
        return Completion(text="", tool_calls=[call], finish_reason="tool_calls")
    return answer


def scripted_episodes(env: Any, policy: Callable[[Any, Mapping[str, Any]], Any], episodes: int | None = None,
                      seed: int = 0) -> Iterator[Trajectory]:
    """``episodes`` tasks of ``env`` (all when ``None``) in an order drawn from ``seed``, each played
    with ``policy(observation, task)``; closes ``env`` at the end."""
    try:
        order = np.random.default_rng(seed).permutation(len(env.tasks))
        for index in order[: episodes if episodes is not None else len(order)]:
            obs, info = env.reset(options={"task_index": int(index)})
            task, done = info["task"], False
            while not done:
                obs, _, terminated, truncated, info = env.step(policy(obs, task))
                done = terminated or truncated
            yield info["trajectory"]
    finally:
        env.close()


def write_solved_episodes(path: str | Path, episodes: Iterable[Trajectory]) -> GoldCounts:
    """Write the ``episodes`` that scored 1 to ``path`` (JSONL), skipping and counting the others."""
    written = skipped = 0
    with TrajectoryWriter(path) as writer:
        for trajectory in episodes:
            if (trajectory.final_reward or 0.0) >= 1.0:
                writer.write(trajectory)
                written += 1
            else:
                skipped += 1
    return GoldCounts(written, skipped)


def gold_command(name: str, doc: str | None, gold_episodes: Callable[[dict[str, Any], int | None, int], Iterable[Trajectory]]
                 ) -> Callable[[list[str] | None], int]:
    """``main(argv) -> exit status`` of an env's gold module (``python -m agentgym_lightning.envs.<name>.gold``,
    described by the first paragraph of ``doc``): ``--config`` (a train recipe, ``recipes/<name>.yaml``,
    whose ``env_kwargs`` to use), ``--env-kwarg``, ``--episodes``, ``--seed``, ``--output``; it writes
    the ``gold_episodes(env_kwargs, episodes, seed)`` that scored 1, and exits 2 on a bad option."""

    def main(argv: list[str] | None = None) -> int:
        parser = argparse.ArgumentParser(prog=f"python -m agentgym_lightning.envs.{name}.gold", description=(doc or "").split("\n\n")[0])
        parser.add_argument("--config", metavar="FILE.yaml", help=f"a train recipe whose env_kwargs to use (recipes/{name}.yaml)")
        parser.add_argument("--env-kwarg", action="append", default=[], metavar="KEY=VALUE", help="env keyword argument (repeatable; JSON values)")
        parser.add_argument("--episodes", type=int, default=None, help="how many train tasks (default: all)")
        parser.add_argument("--seed", type=int, default=0, help="the tasks' order")
        parser.add_argument("--output", required=True, help="the trajectory JSONL to write")
        args = parser.parse_args(argv)

        kwargs = recipe_env_kwargs(args.config) if args.config else {"split": "train"}
        for item in args.env_kwarg:
            key, _, value = item.partition("=")
            try:
                kwargs[key] = json.loads(value)
            except ValueError:
                kwargs[key] = value
        try:
            counts = write_solved_episodes(args.output, gold_episodes(kwargs, args.episodes, args.seed))
        except ValueError as exc:
            print(f"{name} gold: {exc}", file=sys.stderr)
            return 2
        print(f"{args.output}: {counts.written} gold episodes scored 1 and were written; {counts.skipped} did not and were skipped")
        return 0

    return main
