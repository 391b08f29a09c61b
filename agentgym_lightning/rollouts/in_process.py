"""The batched driver: run many episodes at once, handing their calls to the policy: each as it
comes (``policy.submit``) where the policy schedules per decode step, else in batches
(``policy.generate``).

How it drives (continuous batching):

- Every env tells the driver when its agent has called or ended
  (:meth:`~agentgym_lightning.env.AgentEnv.set_ready_callback`), and the driver takes whichever
  env is ready first (``step_wait(timeout=0)``): no agent ever waits for another one, and an agent
  that hangs costs only its own episode (it is truncated at its ``time_limit``).
- A policy that schedules per decode step (``submit``, :class:`~agentgym_lightning.policies.base.SchedulingPolicy`:
  ``hf``, ``vllm``, ``openai``/``vllm-server``) gets each call the moment its agent makes it; the call joins the policy's running batch
  at its next decode step and is answered the moment its own completion ends, so no call waits
  for another's. ``max_batch_wait`` and ``max_batch_size`` do not apply (the policy has its own
  ``max_batch_size``).
- For any other policy, pending calls are batched. A batch goes to ``policy.generate`` as soon as every running agent
  is waiting on the policy, or the batch holds ``max_batch_size`` calls, or its oldest call has
  waited for stragglers as long as it may: ``max_batch_wait`` seconds (default 0.05 s), and never
  more than a tenth of what the last ``generate`` took (``BATCH_WAIT_FRACTION``), so waiting
  costs at most ~10 % of generation time: a fast policy answers at once, a slow one gets fuller
  batches. A slow agent delays the others' next batch by at most that, never by its own
  slowness. ``max_batch_wait=None`` waits for every running agent (lock-step rounds: the largest
  batches, the slowest agent sets the pace).
- While ``generate`` runs, answered agents run on (tools, SQL, retrieval) and their next calls
  queue up for the next batch.
- Episodes come in groups of ``group_size`` on the same task with isolated state (GRPO groups);
  a slot is refilled with the next episode as soon as its episode finishes.
- Every request handed to the policy names its episode in ``metadata[EPISODE_KEY]`` (the
  recorded request is left as the agent sent it), so a policy with several replicas keeps each
  episode on one of them.

When ``generate`` raises, the requests that fail on their own are found and answered with an
OpenAI-style 400 error (the agent decides what to do, as with any API error), the others as usual
(:class:`~agentgym_lightning.policies.isolation.FailureIsolator`); a submitted call that fails is
settled the same way, alone (before the backend has answered any call, a failed one waits for
the calls still in flight, as a failed batch's requests wait for the rest of the batch: the
backend is down only if none of them succeeds). When the backend itself is down, the batch's (the call's) episodes
end ``infra_failed``, and after ``MAX_POLICY_FAILURES`` such batches (calls) in a row the error is
raised.
"""

from __future__ import annotations

import heapq
import logging
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from agentgym_lightning.env import AgentEnv
from agentgym_lightning.llm import ChatRequest
from agentgym_lightning.policies.base import schedules_per_step
from agentgym_lightning.policies.isolation import FailureIsolator, PolicyDown
from agentgym_lightning.policy_request import tagged
from agentgym_lightning.registration import make_env_factory
from agentgym_lightning.rollouts.base import Rollouts
from agentgym_lightning.spaces import Observation
from agentgym_lightning.trajectory import Status, Trajectory

__all__ = [
    "rollout",
    "iter_rollout",
    "InProcessRollouts",
    "RolloutStream",
    "plan_rollout",
    "PolicyFn", "MAX_POLICY_FAILURES", "DEFAULT_MAX_BATCH_WAIT", "BATCH_WAIT_FRACTION"]

log = logging.getLogger(__name__)

#: Anything with ``generate(requests) -> completions``, or such a function itself.
PolicyFn = Callable[[Sequence[ChatRequest]], Sequence[Any]]

#: Consecutive batches failed by the backend (not by a request) after which it is deemed broken.
MAX_POLICY_FAILURES = 3
#: Seconds the oldest pending call may wait for more calls to join its batch, at most.
DEFAULT_MAX_BATCH_WAIT = 0.05
#: ...and at most this fraction of the last ``generate``'s duration.
BATCH_WAIT_FRACTION = 0.1


@dataclass
class _Work:
    task: Any
    group_id: str
    seed: int
    #: Called with the env once the episode has started (its ``episode_id`` is set), from the
    #: driver's thread; ``on_start(None)`` when the stream ends before the episode could start.
    on_start: Callable[[AgentEnv | None], None] | None = None


def _plan(first: AgentEnv, episodes: int, group_size: int, seed: int, tasks: Sequence[Any] | None) -> deque[_Work]:
    """Which task each episode runs: tasks in order (the env's, when it has a list), groups
    sharing one task."""
    if episodes < 1 or group_size < 1:
        raise ValueError(f"episodes and group_size must be >= 1 (got {episodes}, {group_size})")
    source = tasks if tasks is not None else (None if callable(first.tasks) else first.tasks)
    if source is not None and len(source) == 0:
        raise ValueError("tasks is empty")
    rng = np.random.default_rng(seed)
    work: deque[_Work] = deque()
    n_groups = -(-episodes // group_size)
    for g in range(n_groups):
        task = source[g % len(source)] if source is not None else first.sample_task(rng)
        gid = uuid.uuid4().hex[:12]
        for _ in range(group_size):
            if len(work) < episodes:
                work.append(_Work(task, gid, seed + len(work)))
    return work


#: What a submission puts on the ready queue to wake the driver (not a slot).
_WAKE = -1


class _Slot(Enum):
    IDLE = "idle"  # no episode (none left to run)
    STARTING = "starting"  # reset_async done; waiting for the agent's first call
    RUNNING = "running"  # answered; waiting for the agent's next call or end
    PENDING = "pending"  # a call waits for the policy


class _Driver:
    """The state of one stream of episodes (see the module docstring for the rules).

    :meth:`run` is a generator: it drives the episodes and yields each trajectory as it
    finishes. Work comes from the initial plan and from :meth:`submit` (any thread) until
    :meth:`end_submissions`; envs are made on demand, at most ``concurrency`` of them.
    """

    def __init__(
        self,
        factory: Callable[[], AgentEnv],
        envs: list[AgentEnv],
        work: deque[_Work],
        policy: Any,
        max_batch_wait: float | None,
        max_batch_size: int | None,
        concurrency: int,
        open_ended: bool = False,
    ) -> None:
        self.factory = factory
        self.envs = envs
        self.work = work
        self.batcher = FailureIsolator(policy)
        #: ``policy.submit`` when the policy takes calls one at a time, else ``None`` (batches).
        self.submit_call: Callable[[ChatRequest], Future[Any]] | None = policy.submit if schedules_per_step(policy) else None
        #: Submitted calls' futures by slot, and the answers they delivered: ``(slot, serial, future)``.
        self.in_flight: dict[int, Future[Any]] = {}
        self.answers: queue.SimpleQueue[tuple[int, int, Future[Any]]] = queue.SimpleQueue()
        #: Failed calls not settled yet: the backend has answered none, and others are in flight.
        self.undecided: list[tuple[int, int, Exception]] = []
        self.max_batch_wait = max_batch_wait
        self.max_batch_size = max_batch_size
        self.concurrency = concurrency
        self.state: list[_Slot] = []
        self.ready: queue.SimpleQueue[int] = queue.SimpleQueue()
        #: Slots whose call waits for the policy, oldest first, with the call's arrival time.
        self.pending: dict[int, tuple[Observation, float]] = {}
        self.waiting_on_agents = 0  # slots STARTING or RUNNING
        self.deadlines: list[tuple[float, int, int]] = []  # (deadline, episode serial, slot)
        self.serial: list[int] = []
        self.batch_wait = 0.0 if max_batch_wait is None else max_batch_wait  # updated per generate
        self.finished: deque[Trajectory] = deque()
        self.incoming: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self.accepting = open_ended  # more work may still be submitted
        self.stopped = False
        for env in envs:
            self._add_slot(env)

    def _add_slot(self, env: AgentEnv) -> int:
        slot = len(self.state)
        if slot >= len(self.envs):
            self.envs.append(env)
        self.state.append(_Slot.IDLE)
        self.serial.append(0)
        env.set_ready_callback(lambda: self.ready.put(slot))
        return slot

    # ------------------------------------------------------------------ submissions (any thread)

    def submit(self, item: _Work) -> None:
        self.incoming.put(item)
        self.ready.put(_WAKE)

    def end_submissions(self) -> None:
        self.incoming.put(None)
        self.ready.put(_WAKE)

    def _take_submissions(self) -> None:
        took = False
        while True:
            try:
                item = self.incoming.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self.accepting = False
            else:
                self.work.append(item)
                took = True
        if not took:
            return  # planned work is started by _finish as slots free up
        for slot, state in enumerate(self.state):
            if not self.work:
                return
            if state is _Slot.IDLE:
                self._start(slot)
        while self.work and len(self.envs) < self.concurrency:
            self._start(self._add_slot(self.factory()))

    # ------------------------------------------------------------------ the loop

    def run(self) -> Iterator[Trajectory]:
        for slot in range(len(self.envs)):
            self._start(slot)
        while True:
            self._take_submissions()
            if self.stopped:
                self._abort_running("the rollout stream was stopped", Status.TRUNCATED)
            while self.finished:
                yield self.finished.popleft()
            if self.stopped:
                return
            if not (self.waiting_on_agents or self.pending):
                if not self.accepting and not self.work:
                    return
                self._wait_for_agents()  # a submission wakes it
                continue
            if self.pending and self.submit_call is None and self._batch_due():
                try:
                    self._generate()
                except BaseException:
                    while self.finished:  # what ended before the error is reported first
                        yield self.finished.popleft()
                    raise
                continue
            try:
                self._wait_for_agents()
            except BaseException:
                while self.finished:
                    yield self.finished.popleft()
                raise

    def _abort_running(self, reason: str, status: Status) -> None:
        self.work.clear()
        self.pending.clear()
        for future in self.in_flight.values():
            future.cancel()  # the policy drops the row at its next step
        self.in_flight.clear()
        self.undecided.clear()
        for slot, state in enumerate(self.state):
            if state is not _Slot.IDLE:
                env = self.envs[slot]
                if env.trajectory is not None and not env.trajectory.done:
                    self.finished.append(env.abort(reason, status)[4]["trajectory"])
                self.state[slot] = _Slot.IDLE
                self.serial[slot] += 1
        self.waiting_on_agents = 0

    def _batch_due(self) -> bool:
        if not self.waiting_on_agents:
            return True  # nothing else can come
        if self.max_batch_size is not None and len(self.pending) >= self.max_batch_size:
            return True
        if self.max_batch_wait is None:
            return False
        oldest = next(iter(self.pending.values()))[1]
        return time.monotonic() - oldest >= self.batch_wait

    def _wait_for_agents(self) -> None:
        now = time.monotonic()
        until = [self.deadlines[0][0]] if self.deadlines else []
        if self.pending and self.max_batch_wait is not None and self.submit_call is None:
            until.append(next(iter(self.pending.values()))[1] + self.batch_wait)
        try:
            slot: int | None = self.ready.get(timeout=max(0.0, min(until) - now) if until else None)
        except queue.Empty:
            slot = None
        while slot is not None:
            if slot != _WAKE:
                self._poll(slot)
            try:
                slot = self.ready.get_nowait()
            except queue.Empty:
                slot = None
        self._take_answers()
        now = time.monotonic()
        while self.deadlines and self.deadlines[0][0] <= now:
            _, serial, slot = heapq.heappop(self.deadlines)
            # Past its time limit: step_wait ends it as truncated. A slot waiting on the policy
            # is ended by the poll that follows its answer.
            if serial == self.serial[slot]:
                self._poll(slot)

    # ------------------------------------------------------------------ slots

    def _start(self, slot: int) -> None:
        if not self.work:
            self.state[slot] = _Slot.IDLE
            return
        item = self.work.popleft()
        env = self.envs[slot]
        env.reset_async(seed=item.seed, options={"task": item.task, "group_id": item.group_id})
        if item.on_start is not None:
            item.on_start(env)
        self.serial[slot] += 1
        if env.deadline is not None:
            heapq.heappush(self.deadlines, (env.deadline, self.serial[slot], slot))
        self.state[slot] = _Slot.STARTING
        self.waiting_on_agents += 1
        self.ready.put(slot)  # it may have called already

    def _poll(self, slot: int) -> None:
        """Collect what the slot's agent did, if anything (stale wake-ups are ignored)."""
        state, env = self.state[slot], self.envs[slot]
        try:
            if state is _Slot.STARTING:
                obs, info = env.reset_wait(timeout=0)
                # An agent that ended before any LLM call: its end is reported by the next step_wait.
                ended = env.step_wait()[4]["trajectory"] if info.get("episode_over") else None
            elif state is _Slot.RUNNING:
                obs, _, terminated, truncated, info = env.step_wait(timeout=0)
                ended = info["trajectory"] if terminated or truncated else None
            else:
                return
        except TimeoutError:
            return
        self.waiting_on_agents -= 1
        if ended is not None:
            self._finish(slot, ended)
        else:
            self.state[slot] = _Slot.PENDING
            self.pending[slot] = (obs, time.monotonic())
            if self.submit_call is not None:
                self._submit_call(slot)

    def _submit_call(self, slot: int) -> None:
        """Hand the slot's call to the policy at once; its answer wakes the driver."""
        serial = self.serial[slot]
        try:
            future = self.submit_call(self._tagged(slot))  # type: ignore[misc]
        except Exception as exc:  # noqa: BLE001 - refused before it ran: settled like a failed generation
            future = Future()
            future.set_exception(exc)
        self.in_flight[slot] = future

        def delivered(f: Future[Any]) -> None:
            self.answers.put((slot, serial, f))
            self.ready.put(_WAKE)

        future.add_done_callback(delivered)

    def _take_answers(self) -> None:
        """Answer the slots whose submitted calls are done (stale ones, of aborted episodes, are dropped)."""
        while True:
            try:
                slot, serial, future = self.answers.get_nowait()
            except queue.Empty:
                break
            if future.cancelled() or serial != self.serial[slot] or self.in_flight.get(slot) is not future:
                continue
            del self.in_flight[slot]
            error = future.exception()
            if error is not None and not self.batcher.answered_before and self.in_flight:
                # A request's own fault or the backend's? The calls still in flight will tell.
                self.undecided.append((slot, serial, error))
                continue
            self._settle(slot, future.result() if error is None else error)
        if self.undecided and (self.batcher.answered_before or not self.in_flight):
            undecided, self.undecided = self.undecided, []
            for slot, serial, error in undecided:
                if serial == self.serial[slot]:  # not aborted meanwhile
                    self._settle(slot, error)

    def _settle(self, slot: int, outcome: Any) -> None:
        """Hand the slot's submitted call its outcome (a completion, or its failure settled by
        the :class:`FailureIsolator`: a 400, or the backend down)."""
        try:
            answer = self.batcher.settle(self._tagged(slot), outcome)
        except PolicyDown as exc:
            self._policy_down([slot], exc)
            return
        self._answer(slot, answer)

    def _finish(self, slot: int, trajectory: Trajectory) -> None:
        self.serial[slot] += 1  # its deadline entry is stale now
        self.finished.append(trajectory)
        self._start(slot)

    def _tagged(self, slot: int) -> ChatRequest:
        """The slot's pending request, its episode named in ``metadata`` (replica stickiness)."""
        return tagged(self.pending[slot][0].request, self.envs[slot].episode_id)

    def _generate(self) -> None:
        slots = list(self.pending)[: self.max_batch_size or None]
        started = time.monotonic()
        try:
            answers = self.batcher.answer([self._tagged(s) for s in slots])
        except PolicyDown as exc:
            self._policy_down(slots, exc)
            return
        if self.max_batch_wait is not None:
            self.batch_wait = min(self.max_batch_wait, BATCH_WAIT_FRACTION * (time.monotonic() - started))
        for slot, answer in zip(slots, answers):
            self._answer(slot, answer)

    def _answer(self, slot: int, answer: Any) -> None:
        """Hand the slot's pending call its answer (a completion or a 400); its agent runs on."""
        del self.pending[slot]
        env = self.envs[slot]
        env.step_async(answer)
        if env.deadline is not None:  # answering moved it on by the time the call waited
            heapq.heappush(self.deadlines, (env.deadline, self.serial[slot], slot))
        self.state[slot] = _Slot.RUNNING
        self.waiting_on_agents += 1
        self.ready.put(slot)  # its agent may have called again already (parallel calls)

    def _policy_down(self, slots: list[int], exc: PolicyDown) -> None:
        """End the episodes of ``slots``'s calls ``infra_failed``; raise the backend's error after
        ``MAX_POLICY_FAILURES`` failures in a row."""
        cause = exc.__cause__ or exc
        log.error("the policy failed (%d times in a row): %s", self.batcher.failures, cause)
        for slot in slots:
            del self.pending[slot]
            *_, info = self.envs[slot].abort(f"policy backend failed: {cause!r}", Status.INFRA_FAILED)
            self._finish(slot, info["trajectory"])
        if self.batcher.failures >= MAX_POLICY_FAILURES:
            raise cause from None


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
        self._driver = _Driver(
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
        work: deque[_Work],
        concurrency: int,
        max_batch_wait: float | None,
        max_batch_size: int | None,
    ) -> RolloutStream:
        """A stream over a fixed plan (what :meth:`InProcessRollouts.iter_rollout` runs)."""
        stream = cls.__new__(cls)
        stream._factory = factory
        stream._driver = _Driver(factory, envs, work, policy, max_batch_wait, max_batch_size, concurrency)
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
            _Work(task, group_id or uuid.uuid4().hex[:12], default_seed if seed is None else seed, on_start)
        )

    def end(self) -> None:
        """No more submissions: iteration stops once every submitted episode has finished."""
        self._driver.end_submissions()

    @property
    def running(self) -> int:
        """Episodes started and not finished yet."""
        return sum(state is not _Slot.IDLE for state in self._driver.state)

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
            driver.accepting = False
            # Left by an exception (Ctrl-C, SIGTERM) or closed early: the calls still being
            # generated answer nobody now. Cancelled, a scheduling policy drops them at its next
            # step instead of decoding them to their end on its own thread.
            for future in driver.in_flight.values():
                future.cancel()
            driver.in_flight.clear()
            for env in driver.envs:
                env.set_ready_callback(None)
                env.close()
            driver._take_submissions()  # noqa: SLF001 - collect late submissions to refuse them
            for item in driver.work:
                if item.on_start is not None:
                    item.on_start(None)
            driver.work.clear()

    def stop(self) -> None:
        """Ask the driving iteration (on whatever thread) to end the running episodes as
        ``truncated``, yield them and stop; thread-safe, does not wait."""
        self._driver.accepting = False
        self._driver.stopped = True
        self._driver.ready.put(_WAKE)

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
