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
import json
import logging
import queue
import sys
import sysconfig
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentgym_lightning.agent import AgentCancelled, AgentContext, _bind
from agentgym_lightning.gateway.openai_wire import GatewayError, new_call_id
from agentgym_lightning.llm import ChatRequest, Completion
from agentgym_lightning.reward_bounds import RewardRefused, checked_reward
from agentgym_lightning.trajectory import Reward, Step, StepTimings, Trajectory

if TYPE_CHECKING:
    import httpx

    from agentgym_lightning.gateway.gateway import Gateway

__all__ = ["Episode", "PendingCall", "CallEvent", "DoneEvent", "EpisodeEvent"]

log = logging.getLogger(__name__)

_WAIT_SLICE = 0.1
#: How many times :meth:`Episode.stop` raises :class:`AgentCancelled` asynchronously in a thread
#: that makes no call (one raise can be lost: delivered inside a ``__del__`` or a weakref
#: callback it is only printed; each raise also risks landing inside a lock, so few, and only
#: where :func:`_safe_to_raise_in` allows).
_MAX_ASYNC_RAISES = 3


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


_STDLIB = tuple({sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]})
_SITE = tuple({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})


def _safe_to_raise_in(ident: int) -> bool:
    """Whether an asynchronous raise in thread ``ident`` is unlikely to corrupt shared state: not
    while it imports a module (the import lock is process-wide: left held, every import in the
    process would hang), nor while its innermost frame is standard-library code, which takes
    locks by hand (logging's handler locks, http.cookiejar's, threading's conditions) and runs
    finalizers that would only print the exception."""
    frame = sys._current_frames().get(ident)
    if frame is None:
        return False
    path = frame.f_code.co_filename
    if path.startswith("<frozen") or (path.startswith(_STDLIB) and not path.startswith(_SITE)):
        return False
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return False
        frame = frame.f_back
    return True


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
        # Past GatewayLimits.max_lingering_agents workers blocked in C calls, refuse a new
        # episode (raising here leaves the env's previous episode as it was).
        gateway.check_lingering()
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
        self._task: asyncio.Task[Any] | None = None  # the async agent's task, on the agents' loop
        self._reason = ""
        self._stopping = False
        self._escalated = False
        # Guards raising AgentCancelled in the worker against the worker's own exit (a dead
        # thread's id may be reused by another thread, which must never receive it).
        self._raise_lock = threading.Lock()
        self._worker_exiting = False
        self._clients: list[httpx.Client | httpx.AsyncClient] = []
        #: Why a reward of this episode was refused (it must not be trained on), if one was.
        self.refused_reward: str | None = None

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
            try:
                result = self.agent(self.trajectory.task, ctx)
            except BaseException as exc:  # noqa: BLE001 - every way out is reported to the driver
                self._finish(None, exc)
            else:
                self._finish(result, None)
        except AgentCancelled:
            pass  # stop() raised it after the agent had already ended
        finally:
            self._seal_worker()

    def _seal_worker(self) -> None:
        """The worker's last act: no AgentCancelled may be raised in this thread any more."""
        while True:
            try:
                with self._raise_lock:
                    self._worker_exiting = True
                    # One raised just before we took the lock may still be pending: drop it.
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(threading.get_ident()), None)
                return
            except AgentCancelled:
                continue

    async def _run_async(self, ctx: AgentContext) -> None:
        _bind(ctx)
        self._task = asyncio.current_task()
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
        if not self._stopping:
            # Once stopped, nobody reads the event: queued, it would keep the agent's last
            # frames (and every socket they hold) alive for as long as the queue lives.
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
        """Cancel the agent, wait for its worker to end and close its HTTP clients; True if it ended.

        The agent first gets its calls refused (409), to unwind through its own error handling.
        If it still runs after ``grace`` seconds, every further call it makes raises
        :class:`AgentCancelled` in its own thread (a ``BaseException``: ``except Exception``
        cannot swallow it), and a thread that makes no call gets it raised asynchronously, up to
        three times within ``grace`` more seconds (an async agent's task is cancelled instead).
        Python delivers an asynchronous raise at the thread's next bytecode, so a thread blocked
        in a C call (``time.sleep``, a socket read with no timeout) cannot be stopped until that
        call returns: such a worker is left running, reported in the log and in the trajectory's
        ``error``, and counted by :meth:`Gateway.lingering_agents` (starting an episode raises
        past ``GatewayLimits.max_lingering_agents``).
        """
        self._stopping = True
        self.cancel(self._reason or "stopped")
        ok = self._join(grace)
        raised = False
        if not ok:
            self._escalated = True
            ok, raised = self._force_stop(grace)
        if ok and not raised:
            self._close_clients()
        else:
            # A worker still running may be using them (an async one may block the loop their
            # close would run on), and a raise at an arbitrary bytecode may have left one of
            # their locks held: closing could block us. Dropped, their sockets close when the
            # clients are collected.
            with self._lock:
                self._clients.clear()
        if not ok:
            where = self._where()
            log.warning(
                "agent of episode %s did not stop within %.1f s (%s); it is left running until that call returns",
                self.episode_id,
                2 * grace,
                where,
            )
            note = (
                f"[agentgym] the agent's worker did not stop within {2 * grace:.1f} s: {where}. Python cannot "
                "interrupt a call blocked in C code; AgentCancelled is raised when it returns."
            )
            self.trajectory.error = f"{self.trajectory.error}\n{note}" if self.trajectory.error else note
            self.gateway.add_lingering(self.episode_id, self._thread or self._task or self._future, where)
        self.gateway.unregister(self.episode_id)
        return ok

    def _force_stop(self, seconds: float) -> tuple[bool, bool]:
        """``(ended, raised asynchronously)`` after forcing the worker for up to ``seconds``."""
        deadline = time.monotonic() + seconds
        # An agent that keeps calling meets AgentCancelled at its next call: give it a moment.
        if self._join(min(0.1, seconds / 4)):
            return True, False
        raised = 0
        while raised < _MAX_ASYNC_RAISES and time.monotonic() < deadline:
            if self._thread is not None:
                with self._raise_lock:
                    ident = self._thread.ident
                    if self._worker_exiting or not self._thread.is_alive() or ident is None:
                        pass
                    elif _safe_to_raise_in(ident):
                        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(AgentCancelled))
                        raised += 1
                    else:  # inside the import system or a stdlib lock dance: try again shortly
                        if self._join(0.01):
                            return True, raised > 0
                        continue
            elif self._task is not None:
                self.gateway.background_loop().loop.call_soon_threadsafe(self._task.cancel)
                raised += 1
            elif self._future is not None:
                self._future.cancel()  # the task has not started yet
                raised += 1
            if self._join(max(0.0, min(seconds / _MAX_ASYNC_RAISES, deadline - time.monotonic()))):
                return True, self._thread is not None and raised > 0
        ended = self._join(max(0.0, deadline - time.monotonic()))
        return ended, self._thread is not None and raised > 0

    def raise_if_stopped(self, *_: Any) -> None:
        """Called at each LLM call the agent makes: once :meth:`stop` has given up waiting, a call
        from the agent's own thread raises :class:`AgentCancelled` right there, at a clean point
        (unlike an asynchronous raise, it cannot land inside a lock or a finalizer)."""
        if self._escalated and self._thread is not None and threading.get_ident() == self._thread.ident:
            raise AgentCancelled(f"episode {self.episode_id} is over: {self._reason}")

    def _where(self) -> str:
        """Where a surviving worker is (its innermost Python frame), for the report."""
        if self._thread is not None and self._thread.ident is not None:
            frame = sys._current_frames().get(self._thread.ident)
            if frame is not None:
                last = traceback.extract_stack(frame)[-1]
                return f"blocked at {last.filename}:{last.lineno} in {last.name}: {(last.line or '').strip()[:120]}"
            return "its thread is still alive"
        return "its task did not end (an async agent blocking the event loop, or swallowing CancelledError)"

    def _join(self, timeout: float) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        if self._future is not None:
            end = time.monotonic() + timeout
            self._finished.wait(timeout)
            # The task ends just after the agent does (or, cancelled, may outlive the future).
            while not (self._future.done() and (self._task is None or self._task.done())):
                if time.monotonic() >= end:
                    return False
                time.sleep(0.005)
        return True

    # ------------------------------------------------------------------ HTTP clients

    def http_client(self) -> httpx.Client:
        """An httpx client for the agent (see :meth:`Gateway.http_client`); closed by :meth:`stop`."""
        client = self.gateway.http_client(self.transport)
        # Over HTTP the refusal comes back as a response: raise at that clean point too.
        client.event_hooks["response"].append(self.raise_if_stopped)
        self._remember(client)
        return client

    def async_http_client(self) -> httpx.AsyncClient:
        """An async httpx client for the agent; closed by :meth:`stop` (for ``async def`` agents)."""
        client = self.gateway.async_http_client(self.transport)
        if self.transport != "inproc":
            self._remember(client)
        return client

    def _remember(self, client: httpx.Client | httpx.AsyncClient) -> None:
        with self._lock:
            self._clients.append(client)

    def _close_clients(self) -> None:
        """Close the agent's HTTP clients now: their sockets must not wait for the garbage collector."""
        with self._lock:
            clients, self._clients = self._clients, []
        for client in clients:
            try:
                if hasattr(client, "aclose"):
                    if self._future is not None:  # used on the agents' loop: closed there
                        self.gateway.background_loop().submit(client.aclose()).result(1.0)
                else:
                    client.close()
            except Exception:  # noqa: BLE001 - best effort: the agent may still be using it
                log.debug("closing an HTTP client of episode %s failed", self.episode_id, exc_info=True)

    # ------------------------------------------------------------------ from the gateway

    def submit(self, request: ChatRequest) -> PendingCall:
        """Record a new LLM call of the agent and announce it; the caller then waits on it."""
        self.raise_if_stopped()
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
        """Set a semantic variable; raises ``ValueError`` past the gateway's ``max_variables``
        names or ``max_variable_bytes`` per value (``docs/limits.md``)."""
        if not isinstance(name, str) or not name:
            raise ValueError("a semantic variable needs a non-empty string name")
        limits = self.gateway.limits
        size = _json_size(value)
        if size > limits.max_variable_bytes:
            raise ValueError(
                f"semantic variable {name!r} is {size} bytes of JSON, over the limit of {limits.max_variable_bytes} "
                "(GatewayLimits.max_variable_bytes): keep big data in the agent's own storage and emit a summary"
            )
        with self._lock:
            if name not in self._variables and len(self._variables) >= limits.max_variables:
                raise ValueError(
                    f"semantic variable {name!r} would be one more than this episode's limit of "
                    f"{limits.max_variables} (GatewayLimits.max_variables)"
                )
            self._variables[name] = value
            self.trajectory.variables[name] = value
            if self._last_answered is not None:
                self._last_answered.outcome[name] = value

    def emit_reward(self, value: float, source: str = "agent") -> None:
        """Add a reward to the call most recently answered. A reward that is not a finite number
        within ``±MAX_ABS_REWARD`` raises :class:`~agentgym_lightning.reward_bounds.RewardRefused`
        (a ``ValueError``) and excludes the episode (see :meth:`refuse_reward`)."""
        try:
            value = checked_reward(value, f"emit_reward(source={str(source)!r})")
        except RewardRefused as exc:
            self.refuse_reward(str(exc))
            raise
        reward = Reward(value=value, source=str(source))
        with self._lock:
            if self._last_answered is not None:
                self._last_answered.rewards.append(reward)
            else:
                self.trajectory.rewards.append(reward)

    def refuse_reward(self, message: str) -> None:
        """Remember that a reward of this episode was refused: the env ends it ``infra_failed``
        with ``message`` (the first one), whatever else happens (see :mod:`~agentgym_lightning.reward_bounds`)."""
        with self._lock:
            if self.refused_reward is None:
                self.refused_reward = message

    @property
    def variables(self) -> dict[str, Any]:
        """A copy of the agent's current semantic variables."""
        with self._lock:
            return dict(self._variables)


def _json_size(value: Any) -> int:
    """Bytes of ``value`` as JSON (strings and bytes by length; ``repr`` for what JSON cannot hold)."""
    if isinstance(value, (str, bytes)):
        return len(value)
    try:
        return len(json.dumps(value, default=repr, ensure_ascii=False))
    except (TypeError, ValueError, RecursionError):  # a cycle, a non-string key...
        return len(repr(value))
