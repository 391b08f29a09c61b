"""Evaluation: run a policy's episodes, write them, summarise them, log the summary.

The one :func:`evaluate` of the ``eval`` command (:mod:`agentgym_lightning.commands.eval`) and of
the trainer's held-out evals (``LightningRLTrainer.evaluate``). Its metrics are
:func:`agentgym_lightning.metrics.summarize`'s, defined there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym_lightning.env import AgentEnv
from agentgym_lightning.metrics import summarize
from agentgym_lightning.plugin_manager import get_plugin_manager
from agentgym_lightning.rollouts.in_process import rollout
from agentgym_lightning.trajectory import Trajectory, TrajectoryWriter

__all__ = ["evaluate", "EvalResult"]


@dataclass
class EvalResult:
    """What :func:`evaluate` ran: the finished trajectories and their summary."""

    trajectories: list[Trajectory] = field(default_factory=list)
    #: :func:`~agentgym_lightning.metrics.summarize` of ``trajectories``.
    metrics: dict[str, float] = field(default_factory=dict)
    wall_time: float = 0.0
    #: Ctrl-C stopped it early (never with ``strict``): ``trajectories`` are those that finished.
    interrupted: bool = False
    #: Why ``output`` could not be written (a full disk...), if it could not; the eval went on
    #: (never with ``strict``).
    output_error: str | None = None


def evaluate(
    env: str | Callable[[], AgentEnv],
    policy: Any,
    *,
    episodes: int,
    group_size: int = 1,
    concurrency: int = 8,
    seed: int = 0,
    tasks: Sequence[Any] | None = None,
    output: str | Path | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    progress: bool = True,
    log_metrics: bool = True,
    strict: bool = False,
) -> EvalResult:
    """Run ``episodes`` episodes in this process and summarize them.

    ``env``, ``policy`` and the plan's arguments (``tasks``: these tasks in order instead of the
    env's) are as for :func:`~agentgym_lightning.rollouts.in_process.rollout`. Each finished trajectory is written
    to ``output`` (JSONL) as it finishes. The summary is passed to the ``agentgym_log_metrics``
    hook (``step=None``) unless ``log_metrics`` is false.

    By default Ctrl-C stops early and keeps what finished (``result.interrupted``), and a
    failed write of ``output`` (a full disk) is kept in ``result.output_error`` while the eval
    goes on. With ``strict`` both propagate instead (a ``KeyboardInterrupt``, an ``OSError``):
    for callers that handle them themselves, as the trainer does (it checkpoints on Ctrl-C).
    """
    result = EvalResult()
    writer = TrajectoryWriter(output) if output else None

    def on_trajectory(trajectory: Trajectory) -> None:
        result.trajectories.append(trajectory)
        if writer is not None and result.output_error is None:
            try:
                writer.write(trajectory)
            except OSError as exc:  # a full disk costs the file, not the eval: stop writing, say so
                if strict:
                    raise
                result.output_error = f"could not write {output}: {exc.strerror or exc}"

    started = time.perf_counter()
    try:
        rollout(
            env,
            policy,
            episodes=episodes,
            group_size=group_size,
            concurrency=concurrency,
            seed=seed,
            tasks=tasks,
            progress=progress,
            on_trajectory=on_trajectory,
            env_kwargs=env_kwargs or None,
        )
    except KeyboardInterrupt:
        if strict:
            raise
        # rollout has closed the running episodes; what finished is already on disk.
        result.interrupted = True
    finally:
        result.wall_time = time.perf_counter() - started
        if writer is not None:
            try:
                writer.close()
            except OSError as exc:  # what a failed write left buffered cannot be flushed either
                if strict:
                    raise
                result.output_error = result.output_error or f"could not write {output}: {exc.strerror or exc}"
    result.metrics = summarize(result.trajectories, result.wall_time)
    if log_metrics:
        get_plugin_manager().hook.agentgym_log_metrics(metrics=dict(result.metrics), step=None)
    return result
