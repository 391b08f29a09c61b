"""Rollouts on Ray: a step's episodes spread over N worker actors, streamed back as they finish.

Each :class:`RolloutWorker` actor holds its own envs, gateway, agent threads and policy (built
in the actor by the ``policy_factory`` you give: normally the ``openai`` backend pointed at the
generation servers, see :class:`~agentgym_lightning.policies.openai.OpenAIPolicy`), and runs
its share of the step exactly as :func:`~agentgym_lightning.rollouts.in_process.rollout` would in one process:
the step is planned once, here (:func:`~agentgym_lightning.rollouts.in_process.plan_rollout`: the same tasks,
groups and reset seeds as the single-process run), and whole GRPO groups are dealt round-robin
to the workers. Every finished trajectory comes back at once (a Ray streaming generator).

Faults (the contract; ``tests/rollouts/test_ray_workers.py`` checks it):

- A worker that dies (its process killed, its node lost) costs only the episodes it had not
  returned yet: each ends ``infra_failed`` (never a zero reward to train on) with an error naming
  the worker, and is counted in :attr:`RayRolloutRunner.stats` (``workers_lost``,
  ``infra_failed``).
- A worker that returns nothing for ``worker_timeout`` seconds is deemed hung: it is killed and
  treated as dead. Nothing here waits without a time limit.
- With ``retry_infra_failed``, the lost episodes run once more (same plan: same tasks and seeds)
  on the workers still alive (``retried`` counts them, ``recovered`` those that made it) and their
  second outcome is returned instead; what is lost again stays ``infra_failed``. Either way a
  rollout returns exactly ``episodes`` trajectories.
- A dead worker is replaced by a fresh actor at the start of the next :meth:`~RayRolloutRunner.rollout`.
- :meth:`RayRolloutStream.stop` (asynchronous training's shutdown, ``rollouts/async_rollouts.py``)
  ends the episodes running on the workers as ``truncated`` and yields them; episodes not started
  yet are not run, and nothing is retried or marked ``infra_failed`` for the stop.

Ray starts on first use: ``ray.init(address=ray_address)``, a local Ray of ``num_cpus`` CPUs
(no dashboard, no usage stats) when no address is given and none is running. Install with
``pip install 'agentgym-lightning[ray]'``.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentgym_lightning.env import AgentEnv
from agentgym_lightning.registration import make_env_factory
from agentgym_lightning.rollouts.base import Rollouts
from agentgym_lightning.rollouts.in_process import DEFAULT_MAX_BATCH_WAIT, RolloutStream, plan_rollout
from agentgym_lightning.trajectory import Status, Trajectory

__all__ = ["RayRolloutRunner", "RayRolloutStream", "RolloutWorker", "RolloutStats", "init_ray"]

log = logging.getLogger(__name__)

#: Seconds a rollout worker may take to start (import, build its policy).
STARTUP_TIMEOUT = 300.0

#: (task, group_id, reset seed), as :func:`~agentgym_lightning.rollouts.in_process.plan_rollout` gives them.
PlanItem = tuple[Any, str, int]


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Connect to Ray (``address``, e.g. ``ray://head:10001`` or ``auto``) or start a local one:
    ``num_cpus`` CPUs, no dashboard, no usage stats. Does nothing if connected."""
    try:
        import ray
    except ImportError:
        raise ImportError("rollout workers need Ray: pip install 'agentgym-lightning[ray]'") from None
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address:
        ray.init(address=address, log_to_driver=True)
        return
    # No dashboard (its head still binds 127.0.0.1). Ray's own gRPC servers listen on every
    # interface whatever address is given (2.60 resolves 127.0.0.1 to the node's IP); Ray's
    # token authentication (on here: Ray 2.60 says so at start-up) guards them.
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=True, configure_logging=False)


class RolloutWorker:
    """One rollout worker (a Ray actor when made by :class:`RayRolloutRunner`): its own envs,
    gateway, agents and policy; runs the episodes of a plan and yields ``(index, trajectory)``
    as each finishes (``index``: the episode's position in the plan it was given). The actor
    takes two calls at once, so :meth:`stop` reaches a :meth:`run` in progress."""

    def __init__(
        self,
        env: str | Callable[[], AgentEnv],
        policy_factory: Callable[[], Any],
        env_kwargs: Mapping[str, Any] | None = None,
        max_batch_wait: float | None = DEFAULT_MAX_BATCH_WAIT,
    ) -> None:
        self.factory = make_env_factory(env, env_kwargs)
        self.policy = policy_factory()
        self.max_batch_wait = max_batch_wait
        self._lock = threading.Lock()
        self._running: dict[str, RolloutStream] = {}
        self._stopped: set[str] = set()  # runs stopped before they started

    def pid(self) -> int:
        """The worker's process id (tests kill it)."""
        return os.getpid()

    def run(self, plan: Sequence[PlanItem], concurrency: int, run_id: str = "") -> Iterator[tuple[int, Trajectory]]:
        stream = RolloutStream(self.factory, self.policy, concurrency=concurrency, max_batch_wait=self.max_batch_wait)
        with self._lock:
            self._running[run_id] = stream
            stopped = run_id in self._stopped
        index_of: dict[str, int] = {}

        def started(index: int, env: AgentEnv | None) -> None:
            if env is not None and env.episode_id is not None:
                index_of[env.episode_id] = index

        for index, (task, group_id, seed) in enumerate(plan):
            stream.submit(task, group_id=group_id, seed=seed, on_start=functools.partial(started, index))
        stream.end()
        if stopped:
            stream.stop()
        try:
            with stream:
                for trajectory in stream:
                    yield index_of[trajectory.episode_id], trajectory
        finally:
            with self._lock:
                self._running.pop(run_id, None)
                self._stopped.discard(run_id)

    def stop(self, run_id: str = "") -> None:
        """End run ``run_id``'s running episodes as truncated (its :meth:`run` yields them and
        ends) and start none of its others; a run not started yet will stop at once."""
        with self._lock:
            stream = self._running.get(run_id)
            if stream is None:
                self._stopped.add(run_id)
        if stream is not None:
            stream.stop()

    def close(self) -> None:
        close = getattr(self.policy, "close", None)
        if close is not None:
            close()


@dataclass
class RolloutStats:
    """What happened to the workers during the last :meth:`RayRolloutRunner.rollout`."""

    #: Workers that died or hung (and were killed).
    workers_lost: int = 0
    #: Episodes lost with their worker (ended ``infra_failed``, or retried).
    infra_failed: int = 0
    #: Of those, episodes run again (``retry_infra_failed``).
    retried: int = 0
    #: Of those retried, the ones that succeeded the second time (any status but infra_failed).
    recovered: int = 0
    per_worker: dict[int, int] = field(default_factory=dict)

    def add(self, **counts: int) -> None:
        """Add ``counts`` to the fields of those names."""
        for name, n in counts.items():
            setattr(self, name, getattr(self, name) + n)

    def as_metrics(self, prefix: str = "rollout/") -> dict[str, float]:
        return {
            f"{prefix}workers_lost": float(self.workers_lost),
            f"{prefix}infra_failed_lost_worker": float(self.infra_failed),
            f"{prefix}retried": float(self.retried),
            f"{prefix}recovered": float(self.recovered),
        }


class RayRolloutRunner(Rollouts):
    """Runs rollouts on ``num_workers`` Ray actors (see the module docstring): the same plan as
    in one process for the same arguments (the same episodes), trajectories in the order they
    finished; ``concurrency`` is the total over all workers.

    Args:
        env: An env id or a (picklable) factory returning an ``AgentEnv``; built in each worker.
        policy_factory: A picklable zero-argument callable building the policy in each worker
            (e.g. ``functools.partial(make_policy, "openai", "", base_url=[...])``).
        num_workers: Worker actors.
        env_kwargs: ``gym.make`` keyword arguments when ``env`` is an id.
        ray_address: An existing cluster (``auto``, ``ray://host:10001``); ``None`` starts a
            local Ray (or joins the one already initialised in this process).
        num_cpus: CPUs of the local Ray (default: ``num_workers``; ignored with an address).
        worker_cpus: CPUs each actor reserves (fractions allowed: agents mostly wait on I/O).
        worker_timeout: Seconds a worker may go without returning a trajectory before it is
            deemed hung and killed.
        max_batch_wait: Each worker's batching wait, as in :func:`~agentgym_lightning.rollouts.in_process.rollout`.
        retry_infra_failed: Run the episodes lost with their workers once more (see the
            module docstring).
    """

    def __init__(
        self,
        env: str | Callable[[], AgentEnv],
        policy_factory: Callable[[], Any],
        *,
        num_workers: int = 2,
        env_kwargs: Mapping[str, Any] | None = None,
        ray_address: str | None = None,
        num_cpus: int | None = None,
        worker_cpus: float = 0.5,
        worker_timeout: float = 600.0,
        max_batch_wait: float | None = DEFAULT_MAX_BATCH_WAIT,
        retry_infra_failed: bool = False,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if worker_timeout <= 0:
            raise ValueError(f"worker_timeout must be > 0 seconds, got {worker_timeout}")
        self.env = env
        self.env_kwargs = dict(env_kwargs or {})
        self.policy_factory = policy_factory
        self.num_workers = num_workers
        self.worker_cpus = worker_cpus
        self.worker_timeout = worker_timeout
        self.max_batch_wait = max_batch_wait
        self.retry_infra_failed = retry_infra_failed
        init_ray(ray_address, num_cpus if num_cpus is not None else (None if ray_address else num_workers))
        import ray

        self._ray = ray
        self._actor_class = ray.remote(RolloutWorker)
        self._workers: list[Any] = [None] * num_workers
        self.stats = RolloutStats()
        self._stats_lock = threading.Lock()
        self._untaken = RolloutStats()  # counted since the last take_stats()

    # ------------------------------------------------------------------ workers

    def _ensure_workers(self) -> None:
        for i, worker in enumerate(self._workers):
            if worker is None:
                # Two calls at once: stop() reaches a run() in progress.
                self._workers[i] = self._actor_class.options(num_cpus=self.worker_cpus, max_restarts=0, max_concurrency=2).remote(
                    self.env, self.policy_factory, self.env_kwargs, self.max_batch_wait
                )

    def worker_pids(self) -> list[int]:
        """The workers' process ids, once every worker is up (starting any that are not):
        actor start-up (imports, the policy) does not count against ``worker_timeout``."""
        self._ensure_workers()
        try:
            return self._ray.get([w.pid.remote() for w in self._workers], timeout=STARTUP_TIMEOUT)
        except self._ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"rollout workers did not start within {STARTUP_TIMEOUT} s; see Ray's worker logs") from None

    def kill_worker(self, index: int) -> None:
        """Kill worker ``index`` now (fault drills): its in-flight episodes end ``infra_failed``."""
        worker = self._workers[index]
        if worker is not None:
            self._ray.kill(worker, no_restart=True)

    def close_workers(self) -> None:
        for i, worker in enumerate(self._workers):
            if worker is not None:
                try:
                    self._ray.get(worker.close.remote(), timeout=10)
                except Exception:  # noqa: BLE001 - a dead worker has nothing to close
                    pass
                self._ray.kill(worker, no_restart=True)
                self._workers[i] = None

    def close(self) -> None:
        """Stop the workers (Ray itself stays up: ``ray.shutdown()`` is yours to call)."""
        self.close_workers()

    def __enter__(self) -> RayRolloutRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ rollouts

    def iter_rollout(
        self,
        *,
        episodes: int,
        group_size: int = 1,
        concurrency: int = 8,
        seed: int = 0,
        tasks: Sequence[Any] | None = None,
    ) -> RayRolloutStream:
        """The trajectories of the plan as they finish (see :meth:`Rollouts.iter_rollout`), as a
        :class:`RayRolloutStream` (:meth:`~RayRolloutStream.stop` ends it early)."""
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        probe = make_env_factory(self.env, self.env_kwargs)()
        try:
            plan = plan_rollout(probe, episodes=episodes, group_size=group_size, seed=seed, tasks=tasks)
        finally:
            probe.close()
        self.stats = RolloutStats()
        self.worker_pids()  # every worker up before the clock of worker_timeout starts
        stopping = threading.Event()
        run_id = uuid.uuid4().hex
        return RayRolloutStream(self._iterate(plan, concurrency, run_id, stopping), functools.partial(self._stop, run_id, stopping))

    def take_stats(self) -> RolloutStats:
        """What happened to the workers since the last call (over every rollout since; thread-safe):
        a step's worker faults when rollouts run on beside the update (``max_staleness`` >= 1)."""
        with self._stats_lock:
            taken, self._untaken = self._untaken, RolloutStats()
        return taken

    def _count(self, **counts: int) -> None:
        with self._stats_lock:
            self.stats.add(**counts)
            self._untaken.add(**counts)

    def _stop(self, run_id: str, stopping: threading.Event) -> None:
        stopping.set()
        for worker in self._workers:
            if worker is not None:
                worker.stop.remote(run_id)  # not awaited: the worker's stream ends with its episodes

    def _iterate(self, plan: list[PlanItem], concurrency: int, run_id: str, stopping: threading.Event) -> Iterator[Trajectory]:
        lost: list[tuple[PlanItem, Trajectory]] = []
        for outcome in self._run(plan, list(range(self.num_workers)), concurrency, run_id, stopping):
            if isinstance(outcome, Trajectory):
                yield outcome
            elif self.retry_infra_failed:
                lost.append(outcome)  # its retry's outcome is yielded instead
            else:
                self._count(infra_failed=1)
                yield outcome[1]
        if not lost or stopping.is_set():
            return
        self._count(infra_failed=len(lost), retried=len(lost))
        alive = [i for i, w in enumerate(self._workers) if w is not None]
        if not alive:
            self._ensure_workers()
            alive = list(range(self.num_workers))
        log.warning("re-running %d episodes lost with their workers, on %d workers", len(lost), len(alive))
        for outcome in self._run([item for item, _ in lost], alive, concurrency, run_id, stopping):
            if isinstance(outcome, Trajectory):
                self._count(recovered=int(outcome.status is not Status.INFRA_FAILED))
                yield outcome
            else:
                yield outcome[1]

    def _run(
        self, plan: list[PlanItem], workers: list[int], concurrency: int, run_id: str, stopping: threading.Event
    ) -> Iterator[Trajectory | tuple[PlanItem, Trajectory]]:
        """Deal ``plan``'s groups to ``workers`` and stream the results back; an episode lost
        with its worker comes as ``(plan item, infra_failed trajectory)``. Once ``stopping`` is
        set, a worker's stream may end before its share (the stop ended it): not a loss."""
        if stopping.is_set():
            return  # stopped before it started: nothing runs
        ray = self._ray
        groups: dict[str, list[PlanItem]] = {}
        for item in plan:
            groups.setdefault(item[1], []).append(item)
        shares: dict[int, list[PlanItem]] = {i: [] for i in workers}
        for n, group in enumerate(groups.values()):
            shares[workers[n % len(workers)]].extend(group)
        streams: dict[int, Any] = {}
        left: dict[int, dict[int, PlanItem]] = {}
        last_heard: dict[int, float] = {}
        for i, share in shares.items():
            if share:
                per_worker = -(-concurrency // len(workers))
                streams[i] = self._workers[i].run.options(num_returns="streaming").remote(share, per_worker, run_id)
                left[i] = dict(enumerate(share))
                last_heard[i] = time.monotonic()
        by_stream = {id(s): i for i, s in streams.items()}
        while streams:
            ready, _ = ray.wait(list(streams.values()), num_returns=1, timeout=1.0)
            for gen in ready:
                i = by_stream[id(gen)]
                try:
                    index, trajectory = ray.get(next(gen), timeout=self.worker_timeout)
                except StopIteration:
                    del streams[i]
                    if not stopping.is_set():
                        yield from self._lose(i, left.pop(i), "its stream ended early")
                    continue
                except Exception as exc:  # noqa: BLE001 - RayActorError and friends: the worker is gone
                    del streams[i]
                    yield from self._lose(i, left.pop(i), f"{type(exc).__name__}: {exc}"[:500], stopping)
                    continue
                last_heard[i] = time.monotonic()
                left[i].pop(index, None)
                with self._stats_lock:
                    self.stats.per_worker[i] = self.stats.per_worker.get(i, 0) + 1
                yield trajectory
                if not left[i]:
                    del streams[i]  # everything came back; the generator's end is not awaited
            now = time.monotonic()
            for i in [i for i in streams if now - last_heard[i] > self.worker_timeout]:
                del streams[i]
                self.kill_worker(i)
                yield from self._lose(i, left.pop(i), f"no episode finished for {self.worker_timeout} s: killed as hung", stopping)

    def _lose(
        self, worker: int, items: Mapping[int, PlanItem], why: str, stopping: threading.Event | None = None
    ) -> Iterator[tuple[PlanItem, Trajectory]]:
        """Count worker ``worker`` lost and yield its ``items`` as ``infra_failed``; none when the
        rollout was being stopped (they were to end unfinished anyway: never failures)."""
        if not items:
            return
        log.error("rollout worker %d lost with %d episodes in flight: %s", worker, len(items), why)
        self._count(workers_lost=1)
        if self._workers[worker] is not None:
            try:
                self._ray.kill(self._workers[worker], no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass
            self._workers[worker] = None
        if stopping is not None and stopping.is_set():
            return
        env_id = self.env if isinstance(self.env, str) else None
        now = time.time()
        for item in items.values():
            task, group_id, _ = item
            yield item, Trajectory(
                episode_id=uuid.uuid4().hex,
                task=task,
                env_id=env_id,
                group_id=group_id,
                status=Status.INFRA_FAILED,
                error=f"rollout worker {worker} was lost ({why}); the episode's progress is gone with it",
                started_at=now,
                ended_at=now,
            )


class RayRolloutStream:
    """The trajectories of one :meth:`RayRolloutRunner.iter_rollout`, as they finish (an
    iterator). :meth:`stop` (any thread) ends it early: the workers end their running episodes
    as ``truncated``, which are still yielded; then iteration stops. :meth:`close` drops the
    rest unread."""

    def __init__(self, trajectories: Iterator[Trajectory], stop: Callable[[], None]) -> None:
        self._trajectories = trajectories
        self._stop = stop

    def __iter__(self) -> RayRolloutStream:
        return self

    def __next__(self) -> Trajectory:
        return next(self._trajectories)

    def stop(self) -> None:
        """Ask the workers to end the running episodes as truncated (does not wait)."""
        self._stop()

    def close(self) -> None:
        close = getattr(self._trajectories, "close", None)
        if close is not None:
            close()
