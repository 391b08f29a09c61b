"""One running episode: the agent's worker, its intercepted calls, and what it recorded.

The agent runs unmodified in a worker (a thread for a plain function, a task on a shared event
loop for an ``async def``). Every LLM call it makes arrives here through the gateway as a
:class:`PendingCall` and is announced on :attr:`Episode.events`; whoever drives the episode
(``AgentEnv``, the batched driver) answers it. This module only records and hands over; the
Gymnasium semantics (rewards, truncation, statuses) live in :mod:`agentgym_lightning.env`.
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentgym_lightning.agent import AgentCancelled, AgentContext, _bind
from agentgym_lightning.gateway.openai_wire import GatewayError, new_call_id
from agentgym_lightning.llm import ChatRequest, Completion
from agentgym_lightning.trajectory import Reward, Step, StepTimings, Trajectory

if TYPE_CHECKING:
    from agentgym_lightning.gateway.gateway import Gateway

__all__ = ["Episode", "PendingCall", "CallEvent", "DoneEvent", "EpisodeEvent"]

log = logging.getLogger(__name__)

_WAIT_SLICE = 0.1


class PendingCall:
    """An intercepted LLM call waiting for its completion.

    The caller waits on it from whatever it runs on (an agent thread, the gateway's event loop,
    an agent's own loop); the driver resolves it from its thread.
    """

    __slots__ = ("episode", "step", "call_id", "completion", "error", "_done", "_gate", "_lock", "_waiters")

    def __init__(self, episode: Episode, step: Step) -> None:
        self.episode = episode
        self.step = step
        self.call_id = new_call_id()
        self.completion: Completion | None = None
        self.error: GatewayError | None = None
        self._done = False
        # A bare lock held until the answer comes: cheaper to release than an Event's condition.
        self._gate = threading.Lock()
        self._gate.acquire()
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    @property
    def request(self) -> ChatRequest:
        return self.step.request

    @property
    def done(self) -> bool:
        return self._done

    def resolve(self, completion: Completion | None = None, error: GatewayError | None = None) -> bool:
        """Hand the answer (or the error) to the waiting caller; False if it was already resolved."""
        with self._lock:
            if self._done:
                return False
            self.completion, self.error = completion, error
            self._done = True
            self._gate.release()
            waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            try:
                loop.call_soon_threadsafe(_set_done, fut)
            except RuntimeError:  # the waiter's loop is closed: nobody is listening any more
                pass
        return True

    def _result(self) -> Completion:
        if self.error is not None:
            raise self.error
        assert self.completion is not None
        return self.completion

    def wait(self, timeout: float | None = None) -> Completion:
        """Block until answered; raises :class:`GatewayError` when the call was refused."""
        # Wait in slices: a thread blocked in one long C-level wait could not be interrupted
        # by the AgentCancelled that Episode.stop() raises in it.
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._done:
            wait = _WAIT_SLICE if deadline is None else min(_WAIT_SLICE, deadline - time.monotonic())
            if wait <= 0:
                raise GatewayError(504, f"no completion within {timeout} s", code="timeout")
            if self._gate.acquire(timeout=wait):
                self._gate.release()  # let any other waiter through too
        return self._result()

    async def wait_async(self) -> Completion:
        """Await the answer from any event loop."""
        if not self._done:
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[None] = loop.create_future()
            with self._lock:
                if not self._done:
                    self._waiters.append((loop, fut))
                else:
                    fut.set_result(None)
            await fut
        return self._result()


def _set_done(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


@dataclass(slots=True)
class CallEvent:
    """The agent made an LLM call; answer ``pending``."""

    episode: Episode
    pending: PendingCall


@dataclass(slots=True)
class DoneEvent:
    """The agent returned ``result``, or raised ``error``."""

    episode: Episode
    result: Any = None
    error: BaseException | None = None


EpisodeEvent = CallEvent | DoneEvent


class Episode:
    """The runtime of one episode of one agent.

    Thread-safe: the gateway calls :meth:`submit`, the agent :meth:`emit_variable` /
    :meth:`emit_reward`, and the driver :meth:`answer` / :meth:`cancel`, each from its own thread.
    """

    def __init__(
        self,
        agent: Callable[..., Any],
        *,
        task: Any,
        gateway: Gateway,
        transport: str = "inproc",
        model_name: str = "policy",
        env_id: str | None = None,
        seed: int | None = None,
        group_id: str | None = None,
        events: queue.SimpleQueue[EpisodeEvent] | None = None,
    ) -> None:
        self.agent = agent
        self.gateway = gateway
        self.transport = transport
        self.model_name = model_name
        self.episode_id = uuid.uuid4().hex
        self.trajectory = Trajectory(
            episode_id=self.episode_id, task=task, env_id=env_id, group_id=group_id, seed=seed, started_at=time.time()
        )
        #: Where calls and the agent's end are announced (shared by a batch of episodes).
        self.events: queue.SimpleQueue[EpisodeEvent] = events if events is not None else queue.SimpleQueue()
        #: Set once the episode is being torn down; the agent may poll ``ctx.cancelled``.
        self.cancelled = threading.Event()
        self._lock = threading.Lock()
        self._variables: dict[str, Any] = {}
        self._pending: dict[str, PendingCall] = {}
        self._last_answered: Step | None = None
        self._finished = threading.Event()
        self._thread: threading.Thread | None = None
        self._future: Any = None  # concurrent.futures.Future of an async agent
        self._reason = ""

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Register with the gateway and start the agent in its worker."""
        self.gateway.register(self)
        ctx = AgentContext(self)
        if inspect.iscoroutinefunction(self.agent) or inspect.iscoroutinefunction(
            getattr(self.agent, "__call__", None)
        ):
            self._future = self.gateway.background_loop().submit(self._run_async(ctx))
        else:
            self._thread = threading.Thread(
                target=self._run_sync, args=(ctx,), name=f"agent-{self.episode_id[:8]}", daemon=True
            )
            self._thread.start()

    def _run_sync(self, ctx: AgentContext) -> None:
        _bind(ctx)
        try:
            result = self.agent(self.trajectory.task, ctx)
        except BaseException as exc:  # noqa: BLE001 - every way out is reported to the driver
            self._finish(None, exc)
        else:
            self._finish(result, None)

    async def _run_async(self, ctx: AgentContext) -> None:
        _bind(ctx)
        try:
            result = await self.agent(self.trajectory.task, ctx)
        except BaseException as exc:  # noqa: BLE001
            self._finish(None, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        else:
            self._finish(result, None)

    def _finish(self, result: Any, error: BaseException | None) -> None:
        if self._finished.is_set():
            return
        self._finished.set()
        self.events.put(DoneEvent(self, result, error))

    @property
    def finished(self) -> bool:
        """The agent's worker has returned or raised."""
        return self._finished.is_set()

    def cancel(self, reason: str) -> None:
        """Refuse every pending and future call so the agent unwinds; does not wait."""
        with self._lock:
            if self.cancelled.is_set():
                return
            self._reason = reason
            self.cancelled.set()
            pending = list(self._pending.values())
            self._pending.clear()
        for call in pending:
            call.resolve(error=GatewayError(409, f"episode {self.episode_id} is over: {reason}", code="episode_closed"))

    def stop(self, grace: float = 1.0) -> bool:
        """Cancel the agent and wait for its worker to end; True if it did.

        A thread that ignores the refused calls gets :class:`AgentCancelled` raised inside it (it
        takes effect at its next Python bytecode, so a thread blocked in a C call ends when the
        call returns).
        """
        self.cancel(self._reason or "stopped")
        ok = self._join(grace)
        if not ok and self._thread is not None and self._thread.ident is not None:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._thread.ident), ctypes.py_object(AgentCancelled))
            ok = self._join(grace)
        elif not ok and self._future is not None:
            self._future.cancel()
            ok = self._join(grace)
        if not ok:
            log.warning("agent of episode %s did not stop within %.1f s; it is left running", self.episode_id, 2 * grace)
        self.gateway.unregister(self.episode_id)
        return ok

    def _join(self, timeout: float) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        if self._future is not None:
            try:
                self._future.result(timeout)
            except BaseException:  # noqa: BLE001 - already reported through DoneEvent
                pass
            return self._future.done()
        return True

    # ------------------------------------------------------------------ from the gateway

    def submit(self, request: ChatRequest) -> PendingCall:
        """Record a new LLM call of the agent and announce it; the caller then waits on it."""
        with self._lock:
            if self.cancelled.is_set():
                raise GatewayError(409, f"episode {self.episode_id} is over: {self._reason}", code="episode_closed")
            if request.sampling.n not in (None, 1):
                raise GatewayError(400, "n > 1 is not supported: make n separate calls (each is one step)")
            step = Step(
                index=len(self.trajectory.steps),
                request=request,
                variables=dict(self._variables),
                trainable=request.trainable,
                role=request.metadata.get("role"),
                agent=request.metadata.get("agent"),
                timings=StepTimings(requested_at=time.time()),
            )
            self.trajectory.steps.append(step)
            call = PendingCall(self, step)
            self._pending[call.call_id] = call
        self.events.put(CallEvent(self, call))
        return call

    # ------------------------------------------------------------------ from the driver

    def answer(self, call: PendingCall, completion: Completion) -> None:
        """Record ``completion`` on the call's step and wake the agent."""
        with self._lock:
            if self._pending.pop(call.call_id, None) is None:
                raise RuntimeError(f"call {call.call_id} of episode {self.episode_id} is not pending")
            call.step.completion = completion
            call.step.timings.answered_at = time.time()
            self._last_answered = call.step
        call.resolve(completion)

    def drop_step(self, call: PendingCall, reason: str) -> None:
        """Refuse a call that will never be answered (the episode was truncated on it) and
        forget its step."""
        with self._lock:
            self._pending.pop(call.call_id, None)
            if call.step in self.trajectory.steps:
                self.trajectory.steps.remove(call.step)
        call.resolve(error=GatewayError(409, f"episode {self.episode_id} is over: {reason}", code="episode_closed"))

    # ------------------------------------------------------------------ from the agent

    def emit_variable(self, name: str, value: Any) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("a semantic variable needs a non-empty string name")
        with self._lock:
            self._variables[name] = value
            self.trajectory.variables[name] = value
            if self._last_answered is not None:
                self._last_answered.outcome[name] = value

    def emit_reward(self, value: float, source: str = "agent") -> None:
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"a reward must be a number, got {value!r}") from None
        reward = Reward(value=value, source=str(source))
        with self._lock:
            if self._last_answered is not None:
                self._last_answered.rewards.append(reward)
            else:
                self.trajectory.rewards.append(reward)

    @property
    def variables(self) -> dict[str, Any]:
        """A copy of the agent's current semantic variables."""
        with self._lock:
            return dict(self._variables)
