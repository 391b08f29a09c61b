"""What every rollout front-end is: one signature, one collect path.

A front-end (:class:`~agentgym_lightning.rollouts.in_process.InProcessRollouts`: the batched
driver in this process; :class:`~agentgym_lightning.rollouts.ray_workers.RayRolloutRunner`: the
same driver on Ray actors; :class:`~agentgym_lightning.rollouts.served_policy.ServedPolicyRollouts`:
the trainer's, its generator served to those actors) implements :meth:`Rollouts.iter_rollout`, the
trajectories of one planned rollout as they finish; :meth:`Rollouts.rollout` drains that stream
with :func:`collect` (progress bar, a callback per trajectory), the same for all of them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from tqdm.auto import tqdm

from agentgym_lightning.trajectory import Trajectory

__all__ = ["Rollouts", "collect"]


class Rollouts(ABC):
    """A rollout front-end: runs the episodes of a plan and yields their trajectories."""

    #: Whether several :meth:`iter_rollout` streams may run at once, each driven on a thread of
    #: its own (asynchronous training overlaps the plans the staleness bound allows).
    concurrent_streams: bool = False

    @abstractmethod
    def iter_rollout(
        self,
        *,
        episodes: int,
        group_size: int = 1,
        concurrency: int = 8,
        seed: int = 0,
        tasks: Sequence[Any] | None = None,
    ) -> Iterator[Trajectory]:
        """Run ``episodes`` episodes and yield each trajectory as it finishes.

        Args:
            episodes: How many episodes to run in total.
            group_size: Episodes per task (GRPO groups); they share a ``group_id``.
            concurrency: Episodes running at once (one env each; over all workers).
            seed: Seeds task sampling (when the env draws tasks) and each episode's reset.
            tasks: Tasks to run, in order (default: the env's own list, in order, or draws
                from it).

        The same arguments give the same plan (tasks, groups, reset seeds) on every front-end
        (:func:`~agentgym_lightning.rollouts.in_process.plan_rollout`).
        """

    def rollout(
        self,
        *,
        episodes: int,
        group_size: int = 1,
        concurrency: int = 8,
        seed: int = 0,
        tasks: Sequence[Any] | None = None,
        progress: bool = True,
        on_trajectory: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """:meth:`iter_rollout`, collected: the trajectories in the order they finished.

        ``progress`` shows a progress bar; ``on_trajectory`` is called with each trajectory as
        it finishes (write it out there: nothing finished is lost if the run is interrupted).
        On any exception (Ctrl-C included) the stream is closed, and with it the running
        episodes, before it propagates.
        """
        stream = self.iter_rollout(episodes=episodes, group_size=group_size, concurrency=concurrency, seed=seed, tasks=tasks)
        return collect(stream, total=episodes, progress=progress, on_trajectory=on_trajectory)


def collect(
    trajectories: Iterable[Trajectory],
    *,
    total: int | None = None,
    progress: bool = True,
    on_trajectory: Callable[[Trajectory], None] | None = None,
) -> list[Trajectory]:
    """Drain a stream of trajectories into a list, with a progress bar (mean reward) and a
    callback per trajectory; the stream is closed however this ends."""
    results: list[Trajectory] = []
    # No bar, no tqdm at all: even a disabled one starts tqdm's monitor thread.
    bar = tqdm(total=total, desc="episodes", unit="ep", dynamic_ncols=True) if progress else None
    reward_sum = 0.0
    try:
        for trajectory in trajectories:
            results.append(trajectory)
            if on_trajectory is not None:
                on_trajectory(trajectory)
            reward_sum += trajectory.total_reward
            if bar is not None:
                bar.update(1)
                bar.set_postfix(reward=f"{reward_sum / len(results):.3f}", refresh=False)
    finally:
        close = getattr(trajectories, "close", None)
        if close is not None:
            close()
        if bar is not None:
            bar.close()
    return results
