"""The episodes SFT learns from: read from run folders and trajectory files, and the best chosen.

A source is a run folder (every episode file in its ``trajectories/``: an RL run's training
episodes; and ``rollouts/``: an SFT run's rounds — never ``eval/``, the held-out episodes) or a
trajectory JSONL file (``eval --output``): :mod:`agentgym_lightning.training.episode_sources`. Episodes are
chosen in this order: infrastructure failures and unfinished episodes never; then
``success_only`` (status succeeded and a positive final reward, :func:`~agentgym_lightning.metrics.succeeded`);
then ``min_reward`` on the return (:attr:`~agentgym_lightning.trajectory.Trajectory.total_reward`:
the final reward plus AIR and emitted rewards, what RL trains on); then the ``top_k`` best of each
task (the same task, compared as JSON), ties broken by seed and episode id so the choice does not
depend on file order.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agentgym_lightning.metrics import succeeded
from agentgym_lightning.training.episode_sources import load_sources as _load_sources
from agentgym_lightning.trajectory import Trajectory

__all__ = ["EpisodeChoice", "load_sources", "choose_episodes", "task_key", "NothingChosenError", "nothing_chosen"]


def load_sources(sources: Sequence[str | Path]) -> list[Trajectory]:
    """Every episode of ``sources``: run folders (never their ``eval/``) or trajectory files
    (:func:`agentgym_lightning.training.episode_sources.load_sources`)."""
    return _load_sources(sources, "SFT source")


def task_key(t: Trajectory) -> str:
    """The episode's task as a comparable key (its JSON)."""
    return json.dumps(t.task, sort_keys=True, default=str)


@dataclass
class EpisodeChoice:
    """The episodes chosen, and how many each rule left out (logged as ``data/...``)."""

    episodes: list[Trajectory] = field(default_factory=list)
    counts: dict[str, float] = field(default_factory=dict)


def choose_episodes(
    trajectories: Iterable[Trajectory], *, min_reward: float | None = None, top_k: int | None = None, success_only: bool = False
) -> EpisodeChoice:
    """The episodes to learn from (the rules and their order: the module docstring)."""
    counts: dict[str, float] = defaultdict(float)
    kept: list[Trajectory] = []
    for t in trajectories:
        counts["episodes/read"] += 1
        if not t.trainable:
            counts["episodes/not_finished"] += 1
        elif success_only and not succeeded(t):
            counts["episodes/not_successful"] += 1
        elif min_reward is not None and t.total_reward < min_reward:
            counts["episodes/below_min_reward"] += 1
        else:
            kept.append(t)
    if top_k is not None:
        by_task: dict[str, list[Trajectory]] = defaultdict(list)
        for t in kept:
            by_task[task_key(t)].append(t)
        kept = []
        for members in by_task.values():
            members.sort(key=lambda t: (-t.total_reward, t.seed if t.seed is not None else 0, t.episode_id))
            kept.extend(members[:top_k])
            counts["episodes/beyond_top_k"] += max(0, len(members) - top_k)
    counts["episodes/chosen"] = float(len(kept))
    counts["tasks/chosen"] = float(len({task_key(t) for t in kept}))
    return EpisodeChoice(episodes=kept, counts=dict(counts))


class NothingChosenError(ValueError):
    """No row to learn from: every episode read was left out, or every call of those chosen."""


#: Why an episode or a call was left out (a ``data/`` count), and the option that decides it.
_LEFT_OUT = {
    "episodes/not_finished": ("not finished or infra_failed (never chosen)", None),
    "episodes/not_successful": ("not successful", "drop --success-only"),
    "episodes/below_min_reward": ("below min_reward", "lower --min-reward"),
    "episodes/beyond_top_k": ("beyond top_k of their task", "raise --top-k"),
}


def nothing_chosen(counts: dict[str, float], min_reward: float | None = None) -> NothingChosenError:
    """The error of a round with no row, from its ``data/`` counts (:func:`choose_episodes`' and
    the rows'): how many episodes each rule left out, or why each call of the chosen ones was not
    trained, and which option to loosen."""
    read, chosen = int(counts.get("episodes/read", 0)), int(counts.get("episodes/chosen", 0))
    if not read:
        return NothingChosenError("nothing to learn from: the sources hold no episodes; give a run folder or a trajectory file that has some")
    if not chosen:
        parts, loosen = [], []
        for key, (what, option) in _LEFT_OUT.items():
            if n := int(counts.get(key, 0)):
                if key == "episodes/below_min_reward" and min_reward is not None:
                    what = f"below min_reward {min_reward:g}"
                parts.append(f"{n} {what}")
                if option:
                    loosen.append(option)
        hint = f"; to keep more: {', '.join(loosen)}" if loosen else "; give sources with finished episodes"
        return NothingChosenError(f"nothing to learn from: 0 of {read} episodes chosen ({', '.join(parts)}){hint}")
    calls = ", ".join(f"{int(v)} {k.removeprefix('calls/').replace('_', ' ')}" for k, v in counts.items() if k.startswith("calls/") and v)
    return NothingChosenError(
        f"nothing to learn from: {chosen} of {read} episodes chosen, but none of their calls makes a row ({calls or 'no calls'}); "
        "loosen --agent-match, or --retokenize always for calls recorded without token ids"
    )
