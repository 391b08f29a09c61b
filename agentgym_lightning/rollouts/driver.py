"""The batched driver's state machine (:class:`Driver`): many episodes at once, each call handed
to the policy as it comes (``policy.submit``); a policy that only answers batches
(``policy.generate``) is wrapped once in a
:class:`~agentgym_lightning.policies.batching.BatchingPolicy`, which batches the calls. Its faces
(``rollout``, ``iter_rollout``, ``RolloutStream``, ``InProcessRollouts``) are in
:mod:`~agentgym_lightning.rollouts.in_process`.

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
- Any other policy is wrapped once in a
  :class:`~agentgym_lightning.policies.batching.BatchingPolicy` (``max_batch_size``,
  ``max_batch_wait`` and the adaptive wait: see :mod:`~agentgym_lightning.policies.batching`),
  and the driver tells it when every running agent is waiting on the policy (``flush``: nothing
  else can come, the batch goes at once). A slow agent delays the others' next batch by at most
  the wait, never by its own slowness; ``max_batch_wait=None`` waits for every running agent
  (lock-step rounds: the largest batches, the slowest agent sets the pace). While ``generate``
  runs (on the wrapper's thread), answered agents run on (tools, SQL, retrieval) and their next
  calls queue up for the next batch.
- Episodes come in groups of ``group_size`` on the same task with isolated state (GRPO groups);
  a slot is refilled with the next episode as soon as its episode finishes.
- Every request handed to the policy names its episode in ``metadata[EPISODE_KEY]`` (the
  recorded request is left as the agent sent it), so a policy with several replicas keeps each
  episode on one of them.

When ``generate`` raises, the requests that fail on their own are found and answered with an
OpenAI-style 400 error (the agent decides what to do, as with any API error), the others as usual
(:class:`~agentgym_lightning.policies.isolation.FailureIsolator`, in the wrapper); a call that a
scheduling policy fails is settled the same way, alone (before the backend has answered any call, a failed one waits for
the calls still in flight, as a failed batch's requests wait for the rest of the batch: the
backend is down only if none of them succeeds). When the backend itself is down, the batch's (the call's) episodes
end ``infra_failed``, and after ``MAX_POLICY_FAILURES`` such batches (calls) in a row the error is
raised.
"""

from __future__ import annotations

import heapq
import logging
import queue
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from enum import Enum
from typing import Any

from agentgym_lightning.env import AgentEnv
from agentgym_lightning.llm import ChatRequest, GatewayError
from agentgym_lightning.policies.base import schedules_per_step
from agentgym_lightning.policies.batching import BatchingPolicy
from agentgym_lightning.policies.isolation import FailureIsolator, PolicyDown
from agentgym_lightning.policy_request import tagged
from agentgym_lightning.spaces import Observation
from agentgym_lightning.trajectory import Status, Trajectory

__all__ = ["Driver", "Work", "MAX_POLICY_FAILURES"]

log = logging.getLogger(__name__)

#: Consecutive batches failed by the backend (not by a request) after which it is deemed broken.
MAX_POLICY_FAILURES = 3


@dataclass
class Work:
    """One episode to run: its task, GRPO group and reset seed."""

    task: Any
    group_id: str
    seed: int
    #: Called with the env once the episode has started (its ``episode_id`` is set), from the
    #: driver's thread; ``on_start(None)`` when the stream ends before the episode could start.
    on_start: Callable[[AgentEnv | None], None] | None = None


#: What a submission puts on the ready queue to wake the driver (not a slot).
_WAKE = -1


class _Slot(Enum):
    IDLE = "idle"  # no episode (none left to run)
    STARTING = "starting"  # reset_async done; waiting for the agent's first call
    RUNNING = "running"  # answered; waiting for the agent's next call or end
    PENDING = "pending"  # a call waits for the policy


class Driver:
    """The state of one stream of episodes (see the module docstring for the rules).

    :meth:`run` is a generator: it drives the episodes and yields each trajectory as it
    finishes. Work comes from the initial plan and from :meth:`submit` (any thread) until
    :meth:`end_submissions`; envs are made on demand, at most ``concurrency`` of them.
    """

    def __init__(
        self,
        factory: Callable[[], AgentEnv],
        envs: list[AgentEnv],
        work: deque[Work],
        policy: Any,
        max_batch_wait: float | None,
        max_batch_size: int | None,
        concurrency: int,
        open_ended: bool = False,
    ) -> None:
        self.factory = factory
        self.envs = envs
        self.work = work
        #: The batching wrapper this driver made for a generate-only policy (it closes it), else ``None``.
        self.owned_batching = (
            None if schedules_per_step(policy)
            else BatchingPolicy(policy, max_batch_size=max_batch_size, max_batch_wait=max_batch_wait, name="agentgym-driver-batching")
        )
        if self.owned_batching is not None:
            policy = self.owned_batching
        #: The batching wrapper the calls go through, if any: its failures come settled (a 400, or
        #: ``PolicyDown``), and it is told when every running agent waits on it (``flush``).
        self.batching = policy if isinstance(policy, BatchingPolicy) else None
        #: Settles a failed call of a policy that schedules calls itself (``submit``).
        self.isolator = FailureIsolator(policy)
        self.submit_call: Callable[[ChatRequest], Future[Any]] = policy.submit
        #: Slots whose calls go to the batching wrapper together at the end of this look at the agents.
        self.unsent: list[int] = []
        #: Calls of a failed batch ended so far, by its ``PolicyDown`` (the error is raised once all have).
        self.down_calls: dict[PolicyDown, int] = {}
        #: Submitted calls' futures by slot, and the answers they delivered: ``(slot, serial, future)``.
        self.in_flight: dict[int, Future[Any]] = {}
        self.answers: queue.SimpleQueue[tuple[int, int, Future[Any]]] = queue.SimpleQueue()
        #: Failed calls not settled yet: the backend has answered none, and others are in flight.
        self.undecided: list[tuple[int, int, Exception]] = []
        self.concurrency = concurrency
        self.state: list[_Slot] = []
        self.ready: queue.SimpleQueue[int] = queue.SimpleQueue()
        #: Slots whose call waits for the policy, oldest first, with the call's arrival time.
        self.pending: dict[int, tuple[Observation, float]] = {}
        self.waiting_on_agents = 0  # slots STARTING or RUNNING
        self.deadlines: list[tuple[float, int, int]] = []  # (deadline, episode serial, slot)
        self.serial: list[int] = []
        self.finished: deque[Trajectory] = deque()
        self.incoming: queue.SimpleQueue[Work | None] = queue.SimpleQueue()
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

    def submit(self, item: Work) -> None:
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

    @property
    def running(self) -> int:
        """Episodes started and not finished yet."""
        return sum(state is not _Slot.IDLE for state in self.state)

    def stop(self) -> None:
        """Ask :meth:`run` (on whatever thread) to end the running episodes as ``truncated``,
        yield them and return; thread-safe, does not wait."""
        self.accepting = False
        self.stopped = True
        self.ready.put(_WAKE)

    def close(self) -> None:
        """After :meth:`run` (finished, left by an exception or closed early): drop the calls still
        in flight, close the envs and tell late submissions they will not start (``on_start(None)``)."""
        self.accepting = False
        # Left by an exception (Ctrl-C, SIGTERM) or closed early: the calls still being
        # generated answer nobody now. Cancelled, a scheduling policy drops them at its next
        # step instead of decoding them to their end on its own thread.
        for future in self.in_flight.values():
            future.cancel()
        self.in_flight.clear()
        if self.owned_batching is not None:
            # Idle unless left mid-batch (Ctrl-C): then that batch ends on its own thread, unanswered.
            self.owned_batching.close(timeout=1.0)
        for env in self.envs:
            env.set_ready_callback(None)
            env.close()
        self._take_submissions()  # collect late submissions to refuse them
        for item in self.work:
            if item.on_start is not None:
                item.on_start(None)
        self.work.clear()

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
            if self.batching is not None and self.in_flight and not self.waiting_on_agents:
                self.batching.flush(self.in_flight.values())  # nothing else can come: no agent runs
            try:
                self._wait_for_agents()
            except BaseException:
                while self.finished:  # what ended before the error is reported first
                    yield self.finished.popleft()
                raise

    def _abort_running(self, reason: str, status: Status) -> None:
        self.work.clear()
        self.pending.clear()
        self.unsent.clear()
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

    def _wait_for_agents(self) -> None:
        now = time.monotonic()
        until = self.deadlines[0][0] if self.deadlines else None
        try:
            slot: int | None = self.ready.get(timeout=None if until is None else max(0.0, until - now))
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
        self._send_unsent()

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
            if self.batching is not None:
                self.unsent.append(slot)  # sent with the other calls of this look (_send_unsent)
            else:
                self._submit_call(slot)

    def _submit_call(self, slot: int) -> None:
        """Hand the slot's call to a policy that schedules calls itself, at once."""
        try:
            future = self.submit_call(self._tagged(slot))
        except Exception as exc:  # noqa: BLE001 - refused before it ran: settled like a failed generation
            future = Future()
            future.set_exception(exc)
        self._track(slot, future)

    def _send_unsent(self) -> None:
        """Hand the calls collected in one look at the agents to the batching wrapper together:
        one batch may take them all, never a part of them while the rest are still being handed
        over (the batch is decided after the whole look, as when the driver batched itself)."""
        slots, self.unsent = self.unsent, []
        if not slots:
            return
        futures: list[Future[Any]]
        try:
            futures = self.batching.submit_all([self._tagged(slot) for slot in slots])  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001 - refused before it ran (closed): each call fails with it
            futures = [Future() for _ in slots]
            for future in futures:
                future.set_exception(exc)
        for slot, future in zip(slots, futures):
            self._track(slot, future)

    def _track(self, slot: int, future: Future[Any]) -> None:
        """Keep the slot's submitted call; its answer wakes the driver."""
        serial = self.serial[slot]
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
            if self.batching is not None:
                self._settled(slot, future, error)
                continue
            if error is not None and not self.isolator.answered_before and self.in_flight:
                # A request's own fault or the backend's? The calls still in flight will tell.
                self.undecided.append((slot, serial, error))
                continue
            self._settle(slot, future.result() if error is None else error)
        if self.undecided and (self.isolator.answered_before or not self.in_flight):
            undecided, self.undecided = self.undecided, []
            for slot, serial, error in undecided:
                if serial == self.serial[slot]:  # not aborted meanwhile
                    self._settle(slot, error)

    def _settle(self, slot: int, outcome: Any) -> None:
        """Hand the slot's submitted call its outcome (a completion, or its failure settled by
        the :class:`FailureIsolator`: a 400, or the backend down)."""
        try:
            answer = self.isolator.settle(self._tagged(slot), outcome)
        except PolicyDown as exc:
            self._policy_down(slot, exc)
            return
        self._answer(slot, answer)

    def _settled(self, slot: int, future: Future[Any], error: BaseException | None) -> None:
        """Hand the slot's call its outcome from the batching wrapper, which settled it already:
        a completion, a 400 (the request failed on its own), or the backend down."""
        if error is None:
            self._answer(slot, future.result())
        elif isinstance(error, GatewayError):
            self._answer(slot, error)
        elif isinstance(error, PolicyDown):
            self._policy_down(slot, error)
        else:
            raise error  # not a request's fault nor the backend's answer (Ctrl-C in generate): as if raised here

    def _finish(self, slot: int, trajectory: Trajectory) -> None:
        self.serial[slot] += 1  # its deadline entry is stale now
        self.finished.append(trajectory)
        self._start(slot)

    def _tagged(self, slot: int) -> ChatRequest:
        """The slot's pending request, its episode named in ``metadata`` (replica stickiness)."""
        return tagged(self.pending[slot][0].request, self.envs[slot].episode_id)

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

    def _policy_down(self, slot: int, exc: PolicyDown) -> None:
        """End the episode of the slot's call ``infra_failed``: the backend failed it (with the
        ``exc.calls`` calls of its batch). After ``MAX_POLICY_FAILURES`` failures in a row, raise
        the backend's error once every call of that batch has ended."""
        cause = exc.__cause__ or exc
        ended = self.down_calls[exc] = self.down_calls.get(exc, 0) + 1
        if ended == 1:
            log.error("the policy failed (%d times in a row): %s", exc.failures, cause)
        del self.pending[slot]
        *_, info = self.envs[slot].abort(f"policy backend failed: {cause!r}", Status.INFRA_FAILED)
        self._finish(slot, info["trajectory"])
        if ended >= exc.calls:
            del self.down_calls[exc]
            if exc.failures >= MAX_POLICY_FAILURES:
                raise cause from None
