"""Asynchronous rollouts (``max_staleness`` k >= 1): episodes go on while the trainer updates.

* **The producer** is a thread that starts the rollout plans of steps ``s = first, first + 1, ...``:
  the same tasks and reset seeds the synchronous loop's step ``s`` runs
  (``schedule.tasks_for(s)``, the step's seed), so which tasks are drawn stays a function of the
  seed. It starts plan ``s`` as soon as the generator holds a version ``>= s - k`` (the wait is
  ``async/generator_wait_s``): it never runs further ahead than the bound lets its groups train.
  Where the front-end runs streams at once (``Rollouts.concurrent_streams``: in this process),
  each plan runs on a thread of its own, so plan ``s + 1`` does not wait for plan ``s``'s slowest
  episode: with k = 1 two plans are in flight while their agents wait on tools. Elsewhere (Ray
  workers) the plans run one after another.
* **The buffer** holds finished groups (all ``num_generations`` episodes of a task done) in the
  order they finished. :meth:`AsyncRollouts.take` gives the update of version ``v`` the next
  ``tasks_per_step`` groups none of whose calls was answered by a version older than ``v - k``
  (``Step.policy_version``), the oldest plan's first: a group of a later plan waits while an
  earlier plan still runs, so step ``s`` trains on plan ``s`` as in the synchronous loop (unless
  groups were dropped) and no straggler is overtaken until it is too stale to train. Staler
  groups are dropped (``async/groups_dropped``), never trained on. How long the update waited
  for them is ``async/update_wait_s``; the staleness of the calls it got,
  ``async/staleness_mean`` and ``async/staleness_max``; how long its episodes ran
  (``async/episodes_s``: the union of their runs, what the step's rates are computed over) and
  how much of that was before the update asked for them, beside earlier updates
  (``async/overlapped_s``, ``async/overlap_fraction``).
* **Nothing lost**: :meth:`AsyncRollouts.close` ends the running episodes as truncated (written to
  ``trajectories/interrupted.jsonl``, not trained on) and :meth:`AsyncRollouts.state` is what the
  checkpoint keeps: the buffered groups with their versions, and the plan to restart from; a
  resumed run (:meth:`AsyncRollouts.restore`) trains on the groups still within ``k`` and drops
  (counts) the others, and re-runs the unfinished plan without the groups it had finished.

The weights reach the generator while episodes run: the trainer syncs after each update and
calls :meth:`AsyncRollouts.advance`, so the next call of a running episode is answered by (and
stamped with) the new version. On Ray rollout workers (``rollout_workers``) the producer drives
the remote rollouts the same way, a plan at a time: the generator stays in the trainer, served to the workers, and
each answer carries its stamp back to the worker's episode; a worker lost mid-plan costs that
plan's episodes on it, retried or ended ``infra_failed`` and counted as in the synchronous loop.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agentgym_lightning.rollouts.base import Rollouts
from agentgym_lightning.rollouts.schedule import TaskSchedule
from agentgym_lightning.trajectory import Trajectory, TrajectoryWriter

__all__ = ["FinishedGroup", "AsyncRollouts", "Taken", "VersionedPolicy", "running_time"]


class VersionedPolicy(Protocol):
    """The generator as the producer sees it: a policy whose answers are stamped with
    :attr:`version` (the trainer's :class:`~agentgym_lightning.training.generation.VersionStamping`;
    named here by its shape, as training comes after rollouts in the flow)."""

    #: The number of updates the generator's weights have seen; every answer is stamped with it.
    version: int


def running_time(trajectories: list[Trajectory], before: float | None = None) -> float:
    """Seconds during which at least one of ``trajectories`` was running (the union of their
    ``started_at``-``ended_at`` spans: a gap between them, or a restart, is not counted); with
    ``before`` (a ``time.time()``), only the part before it."""
    spans = sorted(
        (t.started_at, min(t.ended_at, before) if before is not None else t.ended_at)
        for t in trajectories
        if t.started_at and t.ended_at is not None
    )
    total, end = 0.0, float("-inf")
    for start, stop in spans:
        if stop <= max(start, end):
            continue
        total += stop - max(start, end)
        end = stop
    return total


@dataclass
class FinishedGroup:
    """One task's ``num_generations`` finished episodes, and the plan (step) they came from."""

    plan: int
    trajectories: list[Trajectory]

    @property
    def key(self) -> tuple[int, int]:
        """``(plan, first reset seed)``: the group's place in its plan, the same in a re-run."""
        return self.plan, min(t.seed or 0 for t in self.trajectories)

    @property
    def versions(self) -> list[int]:
        """The policy version of each answered call (``Step.policy_version``)."""
        return [s.policy_version for t in self.trajectories for s in t.steps if s.policy_version is not None]

    def staleness(self, version: int) -> int:
        """How many versions before ``version`` its oldest call was answered (0 with no call)."""
        return max((version - v for v in self.versions), default=0)

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.plan, "trajectories": [t.to_dict(compact=True) for t in self.trajectories]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FinishedGroup:
        return cls(int(data["plan"]), [Trajectory.from_dict(t) for t in data["trajectories"]])


@dataclass
class Taken:
    """What one update trains on: its episodes (in plan and seed order) and the step's metrics."""

    trajectories: list[Trajectory]
    metrics: dict[str, float]
    #: Every group the step looked at within the bound (those without signal among them), for the
    #: run's pass rates.
    examined: list[list[Trajectory]] = field(default_factory=list)


class AsyncRollouts:
    """The producer thread and the buffer of finished groups (see the module docstring).

    Args:
        rollouts: The front-end that runs a plan (``iter_rollout``): in this process, or on Ray
            workers served the stamped generator (their answers carry the stamp back); a stream
            with ``stop()`` ends its running episodes truncated on :meth:`close`.
        stamping: The generator wrapper whose ``version`` stamps every answer (the producer's
            policy answers through it).
        schedule: The run's task schedule (``tasks_for(step)``).
        step_seed: ``fn(step) -> seed`` of a step's plan (the synchronous loop's).
        max_staleness: k >= 1.
        group_size: Episodes per task (``num_generations``).
        concurrency: Episodes running at once.
        output_dir: The run folder (``trajectories/interrupted.jsonl`` on close).
    """

    def __init__(
        self,
        rollouts: Rollouts,
        stamping: VersionedPolicy,
        schedule: TaskSchedule,
        step_seed: Callable[[int], int],
        *,
        max_staleness: int,
        group_size: int,
        concurrency: int,
        output_dir: Path,
    ) -> None:
        if max_staleness < 1:
            raise ValueError(f"asynchronous rollouts need max_staleness >= 1, got {max_staleness}")
        self.rollouts, self.stamping, self.schedule, self.step_seed = rollouts, stamping, schedule, step_seed
        self.max_staleness, self.group_size, self.concurrency = max_staleness, group_size, concurrency
        self.output_dir = output_dir
        self._cond = threading.Condition()
        self._buffer: deque[FinishedGroup] = deque()
        #: The first plan not yet finished, and the keys of its groups (or a later plan's) that finished.
        self._next_plan = 0
        self._finished_keys: set[tuple[int, int]] = set()
        #: The plans running (started, not finished) and the next plan to start.
        self._running: set[int] = set()
        self._next_start = 0
        self._dropped = 0
        #: Groups dynamic sampling set aside for want of signal: the producer may run that many
        #: groups (in whole plans) further ahead, since the steps consume plans faster.
        self._no_signal = 0
        self._generator_wait_s = 0.0
        self._error: BaseException | None = None
        self._stopping = False
        self._streams: dict[int, Any] = {}  # each running plan's stream
        self._thread: threading.Thread | None = None
        self._interrupted: list[Trajectory] = []
        self._restored = False

    # ------------------------------------------------------------------ the trainer's side

    @property
    def version(self) -> int:
        """The version the generator holds (updates its weights have seen)."""
        return self.stamping.version

    def start(self, version: int) -> None:
        """Start producing at the generator's ``version`` (the run's step)."""
        self.stamping.version = version
        if self._thread is None:
            if not self._restored:
                self._next_plan = version  # the synchronous loop's step `version` would run this plan
            self._thread = threading.Thread(target=self._produce, name="async-rollouts", daemon=True)
            self._thread.start()

    def advance(self, version: int) -> None:
        """The generator holds ``version`` now (after the trainer's sync): later calls are
        stamped with it, and plans it unblocks may start."""
        with self._cond:
            self.stamping.version = version
            self._cond.notify_all()

    def take(
        self,
        groups: int,
        *,
        judge: Callable[[list[Trajectory]], Any] | None = None,
        signal: Callable[[list[Trajectory]], bool] | None = None,
        fallback: Callable[[list[Trajectory]], bool] | None = None,
        max_rounds: int = 1,
    ) -> Taken:
        """The next ``groups`` finished groups within the staleness bound of the current version,
        waiting for them; staler ones are dropped and counted. ``judge`` sets the rewards of the
        groups taken (the LLM judge). With ``signal`` (dynamic sampling), a group it rejects is set
        aside and the next one taken instead, until ``groups`` have signal or ``max_rounds`` times
        ``groups`` were examined; a group set aside that ``fallback`` accepts (told apart by shaping
        alone) fills a place left empty then. Raises what stopped the producer."""
        version = self.version
        start, asked_at = time.perf_counter(), time.time()
        chosen: list[FinishedGroup] = []
        examined: list[list[Trajectory]] = []
        held_back: list[FinishedGroup] = []
        dropped = no_signal = told = 0
        limit = groups * max_rounds if signal is not None else groups
        try:
            while len(chosen) < groups and len(examined) < limit:
                pulled, stale = self._pull(min(groups - len(chosen), limit - len(examined)), version)
                dropped += stale
                if judge is not None:
                    judge([t for g in pulled for t in g.trajectories])
                for group in pulled:
                    examined.append(group.trajectories)
                    if signal is None or signal(group.trajectories):
                        chosen.append(group)
                    else:
                        no_signal += 1
                        if fallback is not None and fallback(group.trajectories):
                            held_back.append(group)
                if no_signal > told:
                    with self._cond:  # the producer may now run further ahead
                        self._no_signal += no_signal - told
                        self._cond.notify_all()
                    told = no_signal
        except BaseException:
            with self._cond:
                self._buffer.extendleft(reversed(chosen))  # not trained on: kept for the checkpoint
            raise
        bound_hit = len(chosen) < groups
        shaping = held_back[: groups - len(chosen)]
        chosen += shaping
        with self._cond:
            generator_wait, self._generator_wait_s = self._generator_wait_s, 0.0
        update_wait = time.perf_counter() - start
        chosen.sort(key=lambda g: g.key)
        staleness = [version - v for g in chosen for v in g.versions]
        trajectories = [t for g in chosen for t in sorted(g.trajectories, key=lambda t: t.seed or 0)]
        # The step's rates are over the time its episodes ran, not the update's wait (which is
        # near zero when they finished during the previous update: 161,604 tokens/s read once).
        ran = running_time(trajectories)
        overlapped = running_time(trajectories, before=asked_at)
        metrics = {
            "async/episodes_s": ran,
            "async/overlapped_s": overlapped,
            "async/overlap_fraction": overlapped / ran if ran > 0 else 0.0,
            "async/staleness_mean": sum(staleness) / len(staleness) if staleness else 0.0,
            "async/staleness_max": float(max(staleness, default=0)),
            "async/groups_dropped": float(dropped),
            "async/groups_dropped_total": float(self._dropped),
            "async/update_wait_s": update_wait,
            "async/generator_wait_s": generator_wait,
            "async/groups_buffered": float(len(self._buffer)),
        }
        if signal is not None:
            metrics.update({
                "sampling/rounds": float(-(-len(examined) // groups)),
                "sampling/groups_drawn": float(len(examined)),
                "sampling/groups_zero_variance": float(no_signal - len(shaping)),
                "sampling/groups_kept": float(len(chosen)),
                "sampling/groups_shaping_only": float(len(shaping)),
                "sampling/bound_hit": float(bound_hit),
            })
        return Taken(trajectories, metrics, examined)

    def _pull(self, groups: int, version: int) -> tuple[list[FinishedGroup], int]:
        """The next ``groups`` finished groups within the bound (the oldest plan's first), waiting
        for them, and how many staler ones were dropped on the way."""
        chosen: list[FinishedGroup] = []
        dropped = 0
        with self._cond:
            try:
                while len(chosen) < groups:
                    # The oldest plan's first; a later plan's wait while an earlier one still runs.
                    for group in sorted((g for g in self._buffer if g.plan <= self._next_plan), key=lambda g: g.plan):
                        if len(chosen) == groups:
                            break
                        self._buffer.remove(group)
                        if group.staleness(version) > self.max_staleness:
                            dropped += 1
                            self._dropped += 1
                        else:
                            chosen.append(group)
                    if len(chosen) == groups:
                        break
                    if self._error is not None:
                        raise self._error
                    if self._thread is None or not self._thread.is_alive():
                        raise RuntimeError("the asynchronous rollouts stopped before a step's groups finished")
                    self._cond.wait(timeout=0.5)  # short waits: Ctrl-C reaches the main thread
            except BaseException:
                self._buffer.extendleft(reversed(chosen))  # not trained on: kept for the checkpoint
                raise
        return chosen, dropped

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the buffered groups (their calls' versions in them), the
        plan to restart from and the groups of it (or later) that had finished."""
        with self._cond:
            return {
                "next_plan": self._next_plan,
                "finished_keys": sorted(list(k) for k in self._finished_keys),
                "groups": [g.to_dict() for g in self._buffer],
                "groups_dropped_total": self._dropped,
                "groups_without_signal_total": self._no_signal,
            }

    def restore(self, state: dict[str, Any]) -> None:
        """Take a checkpoint's :meth:`state` back, before :meth:`start`: its groups are trained
        on if still within the bound when taken, else dropped and counted."""
        if self._thread is not None:
            raise RuntimeError("restore() the buffer before start()")
        self._next_plan = int(state.get("next_plan", 0))
        self._finished_keys = {(int(p), int(s)) for p, s in state.get("finished_keys", [])}
        self._buffer = deque(FinishedGroup.from_dict(g) for g in state.get("groups", []))
        self._dropped = int(state.get("groups_dropped_total", 0))
        self._no_signal = int(state.get("groups_without_signal_total", 0))
        self._restored = True

    def close(self) -> None:
        """Stop the producer: its running episodes end truncated and are written to
        ``trajectories/interrupted.jsonl`` (not trained on); the buffer stays for :meth:`state`."""
        with self._cond:
            self._stopping = True
            streams = list(self._streams.values())
            self._cond.notify_all()
        for stream in streams:
            if callable(getattr(stream, "stop", None)):
                stream.stop()
        if self._thread is not None:
            self._thread.join()
        if self._interrupted:
            with TrajectoryWriter(self.output_dir / "trajectories" / "interrupted.jsonl", append=True) as writer:
                for trajectory in self._interrupted:
                    writer.write(trajectory)
            self._interrupted.clear()

    # ------------------------------------------------------------------ the producer thread

    def _produce(self) -> None:
        """Start each plan once the bound allows it (and, where streams cannot run at once, once
        the one before has finished); wait for the running plans when stopping."""
        at_once = bool(getattr(self.rollouts, "concurrent_streams", False))
        threads: list[threading.Thread] = []
        try:
            with self._cond:
                self._next_start = self._next_plan
            while True:
                with self._cond:
                    plan = self._next_start
                    while not self._stopping and self._error is None:
                        # its weights are not out yet (plans set aside for want of signal shift the window)
                        ahead = self._no_signal // self.schedule.tasks_per_step
                        bound = self.stamping.version < plan - self.max_staleness - ahead
                        busy = bool(self._running) and not at_once  # the plan before still runs (one stream at a time)
                        if not (bound or busy):
                            break
                        waited = time.perf_counter()
                        self._cond.wait()
                        if bound and not busy:  # the generator's wait is for weights alone
                            self._generator_wait_s += time.perf_counter() - waited
                    if self._stopping or self._error is not None:
                        return
                    self._running.add(plan)
                    self._next_start = plan + 1
                thread = threading.Thread(target=self._plan_thread, args=(plan,), name=f"async-rollouts-plan-{plan}", daemon=True)
                threads = [t for t in threads if t.is_alive()] + [thread]
                thread.start()
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer's take()
            with self._cond:
                self._error = exc
                self._cond.notify_all()
        finally:
            for thread in threads:
                thread.join()

    def _plan_thread(self, plan: int) -> None:
        try:
            self._run_plan(plan)
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer's take()
            with self._cond:
                self._error = exc
                self._cond.notify_all()
            return
        with self._cond:
            if not self._stopping:  # a stopped plan is not finished: a resume runs it again
                self._running.discard(plan)
                self._next_plan = min(self._running, default=self._next_start)
                self._finished_keys = {k for k in self._finished_keys if k[0] >= self._next_plan}
            self._cond.notify_all()

    def _run_plan(self, plan: int) -> None:
        tasks = self.schedule.tasks_for(plan)
        stream = self.rollouts.iter_rollout(
            episodes=len(tasks) * self.group_size, group_size=self.group_size, concurrency=self.concurrency,
            seed=self.step_seed(plan), tasks=tasks,
        )
        with self._cond:
            self._streams[plan] = stream
            if self._stopping and callable(getattr(stream, "stop", None)):
                stream.stop()
        gathering: dict[str, list[Trajectory]] = {}
        try:
            for trajectory in stream:
                members = gathering.setdefault(trajectory.group_id or trajectory.episode_id, [])
                members.append(trajectory)
                if self._stopping:
                    continue  # the rest are the running episodes, ended truncated
                if len(members) == self.group_size:
                    group = FinishedGroup(plan, gathering.pop(trajectory.group_id or trajectory.episode_id))
                    with self._cond:
                        if group.key not in self._finished_keys:  # a re-run plan: finished before the restart
                            self._finished_keys.add(group.key)
                            self._buffer.append(group)
                            self._cond.notify_all()
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
            with self._cond:
                self._streams.pop(plan, None)
                if self._stopping:
                    self._interrupted.extend(t for members in gathering.values() for t in members)
