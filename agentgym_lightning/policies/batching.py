"""A generate-only policy given a ``submit``: calls handed over one at a time, answered in batches.

Whatever hands a policy its calls one at a time (the batched driver, the policy server) asks it
for ``submit(request) -> Future[Completion]`` (:class:`~agentgym_lightning.policies.base.SchedulingPolicy`).
A policy that only has ``generate(requests)`` is wrapped once in :class:`BatchingPolicy`, which
gathers the submitted calls on a thread of its own and hands them to ``generate`` in batches, so
there is one batching path. A batch goes as soon as

- it holds ``max_batch_size`` calls; or
- the caller says that no other call can come before one of its calls is answered
  (:meth:`BatchingPolicy.flush`: the driver, when every running agent waits on the policy); or
- its oldest call has waited for company as long as it may: ``max_batch_wait`` seconds and, with
  ``wait_fraction`` (the driver's adaptive wait), never more than that fraction of what the last
  ``generate`` took, so waiting costs at most ~10 % of generation time: a fast policy answers at
  once, a slow one gets fuller batches. ``wait_fraction=None`` waits ``max_batch_wait`` flat (the
  policy server's); ``max_batch_wait=None`` waits for a flush or a full batch (lock-step rounds).

A call's wait counts from when it could first join a batch: its submission or, when it was
submitted while a batch was being generated, that batch's end (it queued behind the batch).

Errors are isolated per call (:class:`~agentgym_lightning.policies.isolation.FailureIsolator`):
when ``generate`` raises, the requests that fail on their own are found; the future of each fails
with a 400 :class:`~agentgym_lightning.llm.GatewayError` (the error to hand its agent) and the
others get their completions. When the backend itself is down, every future of the batch fails
with the same :class:`~agentgym_lightning.policies.isolation.PolicyDown` (``failures``: batches
failed in a row; ``calls``: how many calls the batch had).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from agentgym_lightning.llm import ChatRequest, Completion
from agentgym_lightning.policies.base import Policy
from agentgym_lightning.policies.isolation import FailureIsolator, PolicyDown

__all__ = ["BatchingPolicy", "DEFAULT_MAX_BATCH_WAIT", "BATCH_WAIT_FRACTION"]

log = logging.getLogger(__name__)

#: Seconds the oldest queued call may wait for more calls to join its batch, at most.
DEFAULT_MAX_BATCH_WAIT = 0.05
#: ...and at most this fraction of the last ``generate``'s duration (the adaptive wait).
BATCH_WAIT_FRACTION = 0.1


@dataclass
class _Call:
    request: ChatRequest
    future: Future[Any]
    #: When it could first join a batch (``time.monotonic()``): its wait for company counts from here.
    since: float


class BatchingPolicy(Policy):
    """``policy`` (generate-only) with a ``submit``: calls batched on a thread of this wrapper's own
    (see the module docstring for when a batch goes and how errors are isolated).

    Args:
        policy: A :class:`~agentgym_lightning.policies.base.Policy`, or any
            ``fn(requests) -> completions``. Its ``generate`` is only ever called from this
            wrapper's thread, one batch at a time. The wrapper does not own it: :meth:`close`
            leaves it open.
        max_batch_size: Most calls per ``generate`` (``None``: every queued call).
        max_batch_wait: Seconds the oldest queued call may wait for others to join its batch;
            ``None`` waits for :meth:`flush` or a full batch.
        wait_fraction: The adaptive wait: never wait more than this fraction of the last
            ``generate``'s duration; ``None`` waits ``max_batch_wait`` flat.
        lock: Held around each batch's generation (its isolation retries included), e.g. so that
            weights are replaced between two batches, never during one.
        name: The thread's name.

    Thread-safe: calls may be submitted from any thread. The futures are resolved on the
    wrapper's thread, so their callbacks run there: keep them short.
    """

    def __init__(
        self,
        policy: Policy | Callable[[list[ChatRequest]], Sequence[Any]],
        *,
        max_batch_size: int | None = None,
        max_batch_wait: float | None = DEFAULT_MAX_BATCH_WAIT,
        wait_fraction: float | None = BATCH_WAIT_FRACTION,
        lock: AbstractContextManager[Any] | None = None,
        name: str = "agentgym-batching",
    ) -> None:
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1 or None, got {max_batch_size}")
        if max_batch_wait is not None and max_batch_wait < 0:
            raise ValueError(f"max_batch_wait must be >= 0 seconds or None, got {max_batch_wait}")
        if wait_fraction is not None and wait_fraction <= 0:
            raise ValueError(f"wait_fraction must be > 0 or None, got {wait_fraction}")
        self.policy = policy
        self.backend = getattr(policy, "backend", "")
        self.model = getattr(policy, "model", "")
        self.max_batch_size = max_batch_size
        self.max_batch_wait = max_batch_wait
        self.wait_fraction = wait_fraction
        #: The wait now allowed: ``max_batch_wait``, or less after a fast ``generate`` (adaptive).
        self.batch_wait = 0.0 if max_batch_wait is None else max_batch_wait
        #: Calls answered (or failed) and ``generate`` batches made, for logs and benchmarks.
        self.requests = 0
        self.batches = 0
        self._isolator = FailureIsolator(policy)
        self._lock: AbstractContextManager[Any] = lock if lock is not None else contextlib.nullcontext()
        self._name = name
        # Reentrant: a future's callback may submit again from this wrapper's thread.
        self._cond = threading.Condition(threading.RLock())
        self._queue: deque[_Call] = deque()
        self._flush = False
        self._closed = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the callers' side

    def submit(self, request: ChatRequest) -> Future[Completion]:
        """Queue ``request`` for the next batch; its future resolves to its completion or fails
        with its error (see the module docstring). Never blocks on generation."""
        return self.submit_all([request])[0]

    def submit_all(self, requests: Sequence[ChatRequest]) -> list[Future[Completion]]:
        """:meth:`submit` each of ``requests``, queued together: a batch taken meanwhile holds all
        of them or none (up to ``max_batch_size``), as the calls a caller collected in one look
        would be batched if it batched them itself."""
        futures: list[Future[Completion]] = [Future() for _ in requests]
        with self._cond:
            if self._closed:
                raise RuntimeError("this BatchingPolicy is closed: submit calls before close()")
            now = time.monotonic()
            self._queue.extend(_Call(request, future, now) for request, future in zip(requests, futures))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()
        return futures

    def flush(self, waiting_on: Iterable[Future[Any]] = ()) -> None:
        """Send the queued calls now, without waiting for company: the caller knows no other call
        can come before one of ``waiting_on`` (its calls not answered yet) is answered. Ignored
        when one of them is answered already: the caller looked before that answer, which may
        bring more calls, so the usual wait applies. A flush made while a batch is being generated
        ends with that batch (its answers may bring more calls)."""
        with self._cond:
            if any(future.done() for future in waiting_on):
                return
            self._flush = True
            self._cond.notify()

    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        """One completion per request, in order, through the batches; raises the first failed
        call's error (a :class:`~agentgym_lightning.llm.GatewayError` or
        :class:`~agentgym_lightning.policies.isolation.PolicyDown`)."""
        futures = self.submit_all(requests)
        self.flush(futures)  # this caller waits for these: nothing else will come from it
        return [future.result() for future in futures]

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (submissions are refused)."""
        return self._closed

    def close(self, timeout: float | None = 30.0) -> None:
        """No more submissions; the queued calls are still answered, then the thread ends (waited
        for up to ``timeout`` seconds). Idempotent; the wrapped policy stays open."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # ------------------------------------------------------------------ the wrapper's thread

    def _run(self) -> None:
        while True:
            calls = self._next_batch()
            if calls is None:
                return
            self._answer(calls)

    def _next_batch(self) -> list[_Call] | None:
        """Wait until a batch is due and take it (``None``: closed and nothing left)."""
        with self._cond:
            while True:
                if any(call.future.cancelled() for call in self._queue):  # its caller gave up on it
                    self._queue = deque(call for call in self._queue if not call.future.cancelled())
                if not self._queue:
                    if self._closed:
                        return None
                    self._cond.wait()
                    continue
                wait = self._wait_left()
                if self._closed or (wait is not None and wait <= 0):
                    calls = self._take()
                    if calls:
                        return calls
                    continue  # every one was cancelled meanwhile
                self._cond.wait(wait)

    def _wait_left(self) -> float | None:
        """Seconds the queued calls may still wait for company (``<= 0``: due; ``None``: until
        notified)."""
        if self._flush or (self.max_batch_size is not None and len(self._queue) >= self.max_batch_size):
            return 0.0
        if self.max_batch_wait is None:
            return None
        return self._queue[0].since + self.batch_wait - time.monotonic()

    def _take(self) -> list[_Call]:
        calls: list[_Call] = []
        while self._queue and (self.max_batch_size is None or len(calls) < self.max_batch_size):
            call = self._queue.popleft()
            if call.future.set_running_or_notify_cancel():  # a cancelled call is dropped
                calls.append(call)
        self._flush = False  # it covered the calls it found; what comes next waits as usual
        if calls:
            self.batches += 1
            self.requests += len(calls)
        return calls

    def _answer(self, calls: list[_Call]) -> None:
        """Generate one batch and resolve its futures (a failure isolated per call)."""
        started = time.monotonic()
        outcomes: list[Any]
        try:
            with self._lock:
                outcomes = self._isolator.answer([call.request for call in calls])
        except PolicyDown as exc:
            outcomes = [exc] * len(calls)
        except BaseException as exc:  # noqa: BLE001 - not a request's fault: every call of the batch gets it
            log.exception("the batched policy's generate failed")
            outcomes = [exc] * len(calls)
        else:
            if self.wait_fraction is not None and self.max_batch_wait is not None:
                self.batch_wait = min(self.max_batch_wait, self.wait_fraction * (time.monotonic() - started))
        with self._cond:  # resolved together: a flush sees all of this batch's answers or none
            for call, outcome in zip(calls, outcomes):
                if isinstance(outcome, BaseException):
                    call.future.set_exception(outcome)
                else:
                    call.future.set_result(outcome)
            self._flush = False  # whoever flushed during the batch has answers now, and may call again
            ended = time.monotonic()
            for queued in self._queue:
                if queued.since >= started:  # it queued behind this batch: its wait starts now
                    queued.since = ended
