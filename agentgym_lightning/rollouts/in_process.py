"""The batched driver's faces: run many episodes at once in this process (:func:`rollout`,
:func:`iter_rollout`), as a stream fed from any thread (:class:`RolloutStream`), or behind the
front-end signature (:class:`InProcessRollouts`). How it drives (continuous batching, each call
handed to the policy as it comes, a generate-only policy batched by a
:class:`~agentgym_lightning.policies.batching.BatchingPolicy`, failures isolated per call) is
:mod:`~agentgym_lightning.rollouts.driver`'s.
"""

from __future__ import annotations

import threading
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from agentgym_lightning.env import AgentEnv
from agentgym_lightning.llm import ChatRequest
from agentgym_lightning.policies.batching import BATCH_WAIT_FRACTION, DEFAULT_MAX_BATCH_WAIT
from agentgym_lightning.registration import make_env_factory
from agentgym_lightning.rollouts.base import Rollouts
from agentgym_lightning.rollouts.driver import MAX_POLICY_FAILURES, Driver, Work
from agentgym_lightning.trajectory import Trajectory

__all__ = [
    "rollout",
    "iter_rollout",
    "InProcessRollouts",
    "RolloutStream",
    "plan_rollout",
    "PolicyFn", "MAX_POLICY_FAILURES", "DEFAULT_MAX_BATCH_WAIT", "BATCH_WAIT_FRACTION"]

#: Anything with ``generate(requests) -> completions``, or such a function itself.
PolicyFn = Callable[[Sequence[ChatRequest]], Sequence[Any]]


def _plan(first: AgentEnv, episodes: int, group_size: int, seed: int, tasks: Sequence[Any] | None) -> deque[Work]:
    """Which task each episode runs: tasks in order (the env's, when it has a list), groups
    sharing one task."""
    if episodes < 1 or group_size < 1:
        raise ValueError(f"episodes and group_size must be >= 1 (got {episodes}, {group_size})")
    source = tasks if tasks is not None else (None if callable(first.tasks) else first.tasks)
    if source is not None and len(source) == 0:
        raise ValueError("tasks is empty")
    rng = np.random.default_rng(seed)
    work: deque[Work] = deque()
    n_groups = -(-episodes // group_size)
    for g in range(n_groups):
        task = source[g % len(source)] if source is not None else first.sample_task(rng)
        gid = uuid.uuid4().hex[:12]
        for _ in range(group_size):
            if len(work) < episodes:
                work.append(Work(task, gid, seed + len(work)))
    return work


def _check_settings(concurrency: int, max_batch_wait: float | None, max_batch_size: int | None) -> None:
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if max_batch_wait is not None and max_batch_wait < 0:
        raise ValueError(f"max_batch_wait must be >= 0 seconds or None, got {max_batch_wait}")
    if max_batch_size is not None and max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1 or None, got {max_batch_size}")


class RolloutStream:
    """The non-blocking face of :func:`rollout`: episodes submitted from any thread, their
    trajectories yielded as they finish.

    For servers that get work as it comes (the standalone gateway of ``agentgym-lightning
    serve``) and for callers that want each trajectory as soon as it exists::

        stream = RolloutStream("lightning/Arithmetic-v0", policy, concurrency=16)
        stream.submit(task)                  # any thread, any time
        stream.end()                         # no more work: iteration stops once it is done
        for trajectory in stream:            # drives the episodes (sync)...
            ...
        async for trajectory in stream:      # ...or from an event loop (driven on a worker thread)
            ...

    Iterating drives the episodes: nothing runs between two ``next()`` calls, so consume
    promptly (hand trajectories to a queue if their processing is slow). Leaving the loop early
    (``break``, an exception) or :meth:`close` ends the running episodes (truncated) and closes
    the envs. Same batching, grouping and failure rules as :func:`rollout`; envs are made on
    demand, at most ``concurrency``; a submission beyond that waits for a free env.
    """

    def __init__(
        self,
        env: str | Callable[[], AgentEnv],
        policy: Any,
        *,
        concurrency: int = 8,
        env_kwargs: Mapping[str, Any] | None = None,
        max_batch_wait: float | None = DEFAULT_MAX_BATCH_WAIT,
        max_batch_size: int | None = None,
    ) -> None:
        _check_settings(concurrency, max_batch_wait, max_batch_size)
        self._factory = make_env_factory(env, env_kwargs)
        self._driver = Driver(
            self._factory, [], deque(), policy, max_batch_wait, max_batch_size, concurrency, open_ended=True
        )
        self._iterator: Iterator[Trajectory] | None = None
        self._submitted = 0
        self._lock = threading.Lock()

    @classmethod
    def _planned(
        cls,
        factory: Callable[[], AgentEnv],
        policy: Any,
        envs: list[AgentEnv],
        work: deque[Work],
        concurrency: int,
        max_batch_wait: float | None,
        max_batch_size: int | None,
    ) -> RolloutStream:
        """A stream over a fixed plan (what :meth:`InProcessRollouts.iter_rollout` runs)."""
        stream = cls.__new__(cls)
        stream._factory = factory
        stream._driver = Driver(factory, envs, work, policy, max_batch_wait, max_batch_size, concurrency)
        stream._iterator = None
        stream._submitted = len(work)
        stream._lock = threading.Lock()
        return stream

    def submit(
        self,
        task: Any,
        *,
        group_id: str | None = None,
        seed: int | None = None,
        on_start: Callable[[AgentEnv | None], None] | None = None,
    ) -> None:
        """Queue one episode of ``task`` (thread-safe). ``on_start(env)`` is called from the
        driving thread once it has started (``env.episode_id`` is its id), or ``on_start(None)``
        if the stream ends first."""
        if not self._driver.accepting and self._iterator is not None:
            raise RuntimeError("this stream was ended (end() or close()): submit before ending it")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
            # Refused here, in the submitter's thread: in the driver, reset() would raise and stop every episode.
            raise ValueError(f"seed must be an integer in [0, 2**63), got {seed!r}")
        with self._lock:
            default_seed = self._submitted
            self._submitted += 1
        self._driver.submit(
            Work(task, group_id or uuid.uuid4().hex[:12], default_seed if seed is None else seed, on_start)
        )

    def end(self) -> None:
        """No more submissions: iteration stops once every submitted episode has finished."""
        self._driver.end_submissions()

    @property
    def running(self) -> int:
        """Episodes started and not finished yet."""
        return self._driver.running

    def __iter__(self) -> Iterator[Trajectory]:
        if self._iterator is None:
            self._iterator = self._drive()
        return self._iterator

    def __next__(self) -> Trajectory:
        return next(iter(self))

    def _drive(self) -> Iterator[Trajectory]:
        driver = self._driver
        try:
            yield from driver.run()
        finally:
            driver.close()

    def stop(self) -> None:
        """Ask the driving iteration (on whatever thread) to end the running episodes as
        ``truncated``, yield them and stop; thread-safe, does not wait."""
        self._driver.stop()

    def close(self) -> None:
        """End the running episodes (recorded as truncated) and close the envs."""
        self._driver.accepting = False
        iterator = self._iterator
        if iterator is None:
            self._iterator = iterator = self._drive()
        iterator.close()  # type: ignore[attr-defined]

    def __aiter__(self) -> AsyncIterator[Trajectory]:
        return self._aiterate()

    async def _aiterate(self) -> AsyncIterator[Trajectory]:
        import asyncio

        iterator = iter(self)
        done = object()
        while True:
            # The driver runs on a worker thread while this loop stays free.
            item = await asyncio.to_thread(next, iterator, done)
            if item is done:
                return
            yield item  # type: ignore[misc]

    def __enter__(self) -> RolloutStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InProcessRollouts(Rollouts):
    """The batched driver as a rollout front-end: ``env``'s episodes run in this process,
    answered by ``policy`` (see the module docstring for how).

    Args:
        env: An env id (``"lightning/Spider-v0"``) or a factory returning an ``AgentEnv``.
        policy: A :class:`~agentgym_lightning.policies.base.Policy`, or any
            ``fn(requests) -> completions``; it gets each call as it comes when it has ``submit``
            (:class:`~agentgym_lightning.policies.base.SchedulingPolicy`), else the pending calls
            in batches.
        env_kwargs: Keyword arguments for ``gym.make`` when ``env`` is an id.
        max_batch_wait: Batches only: seconds the oldest pending call may wait for others to join
            its batch (and never more than ``BATCH_WAIT_FRACTION`` of the last ``generate``'s
            duration); ``None`` waits for every running agent (lock-step rounds).
        max_batch_size: Batches only: most calls per ``generate`` (default: every pending call).

    :meth:`iter_rollout` returns a :class:`RolloutStream` (iterate it with ``for`` or
    ``async for``); :meth:`~agentgym_lightning.rollouts.base.Rollouts.rollout` collects it.
    Several streams may run at once (each has envs of its own; the policy takes calls from any
    thread).
    """

    concurrent_streams = True

    def __init__(
        self,
        env: str | Callable[[], AgentEnv],
        policy: Any,
        *,
        env_kwargs: Mapping[str, Any] | None = None,
        max_batch_wait: float | None = DEFAULT_MAX_BATCH_WAIT,
        max_batch_size: int | None = None,
    ) -> None:
        self.factory = make_env_factory(env, env_kwargs)
        self.policy = policy
        self.max_batch_wait = max_batch_wait
        self.max_batch_size = max_batch_size

    def iter_rollout(
        self,
        *,
        episodes: int,
        group_size: int = 1,
        concurrency: int = 8,
        seed: int = 0,
        tasks: Sequence[Any] | None = None,
    ) -> RolloutStream:
        _check_settings(concurrency, self.max_batch_wait, self.max_batch_size)
        factory = self.factory
        envs: list[AgentEnv] = [factory()]
        try:
            work = _plan(envs[0], episodes, group_size, seed, tasks)
            envs += [factory() for _ in range(min(concurrency, len(work)) - 1)]
        except BaseException:
            for e in envs:
                e.close()
            raise
        return RolloutStream._planned(factory, self.policy, envs, work, concurrency, self.max_batch_wait, self.max_batch_size)


def iter_rollout(
    env: str | Callable[[], AgentEnv],
    policy: Any,
    *,
    episodes: int,
    group_size: int = 1,
    concurrency: int = 8,
    seed: int = 0,
    tasks: Sequence[Any] | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    max_batch_wait: float | None = DEFAULT_MAX_BATCH_WAIT,
    max_batch_size: int | None = None,
) -> RolloutStream:
    """:func:`rollout` as a stream: iterate it (``for`` or ``async for``) to get each
    trajectory as it finishes. Same arguments and plan as :func:`rollout` (the same seeds give
    the same episodes); see :class:`RolloutStream`."""
    front = InProcessRollouts(env, policy, env_kwargs=env_kwargs, max_batch_wait=max_batch_wait, max_batch_size=max_batch_size)
    return front.iter_rollout(episodes=episodes, group_size=group_size, concurrency=concurrency, seed=seed, tasks=tasks)


def plan_rollout(
    env: AgentEnv, *, episodes: int, group_size: int = 1, seed: int = 0, tasks: Sequence[Any] | None = None
) -> list[tuple[Any, str, int]]:
    """The ``(task, group_id, reset seed)`` of each episode :func:`rollout` would run with these
    arguments, in order (for runners that split a step's episodes across workers)."""
    return [(w.task, w.group_id, w.seed) for w in _plan(env, episodes, group_size, seed, tasks)]


def rollout(
    env: str | Callable[[], AgentEnv],
    policy: Any,
    *,
    episodes: int,
    group_size: int = 1,
    concurrency: int = 8,
    seed: int = 0,
    tasks: Sequence[Any] | None = None,
    progress: bool = True,
    on_trajectory: Callable[[Trajectory], None] | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    max_batch_wait: float | None = DEFAULT_MAX_BATCH_WAIT,
    max_batch_size: int | None = None,
) -> list[Trajectory]:
    """Run ``episodes`` episodes of ``env`` with ``policy``; returns their trajectories in the
    order they finished: :class:`InProcessRollouts` ``(env, policy, ...).rollout(...)``.

    The plan's arguments (``episodes``, ``group_size``, ``concurrency``, ``seed``, ``tasks``)
    and ``progress``/``on_trajectory`` are those of every front-end
    (:class:`~agentgym_lightning.rollouts.base.Rollouts`); ``env``, ``policy``, ``env_kwargs``,
    ``max_batch_wait`` and ``max_batch_size`` are :class:`InProcessRollouts`'s.

    A request the backend rejects fails only its own call (an OpenAI 400 to that agent); a
    backend that fails every request ends those episodes ``infra_failed`` and, after
    ``MAX_POLICY_FAILURES`` batches in a row, raises. On any exception (Ctrl-C included) running
    episodes are closed (recorded as truncated) before it propagates. For a stream of
    trajectories as they finish (sync or async), see :func:`iter_rollout`.
    """
    front = InProcessRollouts(env, policy, env_kwargs=env_kwargs, max_batch_wait=max_batch_wait, max_batch_size=max_batch_size)
    return front.rollout(
        episodes=episodes,
        group_size=group_size,
        concurrency=concurrency,
        seed=seed,
        tasks=tasks,
        progress=progress,
        on_trajectory=on_trajectory,
    )
