"""A rollout in which every episode failed before its first LLM call: nothing to learn or measure.

A missing package or an agent that cannot start fails every episode the same way, and would fail
every later step too: the trainer's rollouts and held-out evals stop at once with the agent's own
error (:class:`EpisodesFailedError`) rather than train and report ``0.0 -> 0.0``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from agentgym_lightning.trajectory import Trajectory

__all__ = ["EpisodesFailedError", "check_episodes_ran"]


class EpisodesFailedError(RuntimeError):
    """Every episode of a rollout failed before its first LLM call (a missing package, an agent
    that cannot start): nothing can be learned, and every later step would fail the same way."""


def check_episodes_ran(trajectories: Sequence[Trajectory], what: str, path: Path) -> None:
    """Raise :class:`EpisodesFailedError` when every one of ``trajectories`` ended in an error
    without making a single LLM call; ``path`` is where their tracebacks were written."""
    if not trajectories or any(t.steps or not t.error for t in trajectories):
        return
    last_line = next((line for line in reversed(str(trajectories[0].error).strip().splitlines()) if line.strip()), "")
    raise EpisodesFailedError(
        f"every episode of {what} ({len(trajectories)}) failed before its first LLM call, so there is nothing "
        f"to learn from; the first one's error: {last_line.strip()} (tracebacks in {path})"
    )
