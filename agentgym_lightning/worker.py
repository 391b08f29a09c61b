"""The agent's worker: runs ``agent(task, ctx)`` for one episode, and stops it.

A plain function runs on a thread of its own; an ``async def`` runs as a task on the gateway's
shared event loop. Whatever the agent returns or raises is handed to its
:class:`~agentgym_lightning.episode.Episode` (a :class:`~agentgym_lightning.episode.DoneEvent`).
Stopping is the hard part: the agent's calls are refused first so it unwinds through its own error
handling, then :class:`~agentgym_lightning.agent.AgentCancelled` is raised at its next call or,
sparingly, asynchronously inside its thread; a worker blocked in a C call cannot be interrupted
and is reported to the gateway as lingering (:meth:`Gateway.lingering_agents`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import inspect
import logging
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from agentgym_lightning.agent import AgentCancelled, AgentContext, bind_context
from agentgym_lightning.episode import Episode
from agentgym_lightning.gateway.endpoint import EpisodeEndpoint
from agentgym_lightning.tracing.processor import episode_trace

__all__ = ["AgentWorker"]

log = logging.getLogger(__name__)

#: How many times :meth:`AgentWorker.stop` raises :class:`AgentCancelled` asynchronously in a
#: thread that makes no call, within its grace (one raise can be lost: delivered inside a
#: ``__del__`` or a weakref callback it is only printed; each raise also risks landing inside a
#: lock, so few, and only where :func:`_safe_to_raise_in` allows). A thread still running after
#: them gets one more every grace seconds (:meth:`AgentWorker._keep_stopping`).
_MAX_ASYNC_RAISES = 3

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


def is_async_agent(agent: Callable[..., Any]) -> bool:
    """Whether ``agent`` is an ``async def`` (or an object whose ``__call__`` is one)."""
    return inspect.iscoroutinefunction(agent) or inspect.iscoroutinefunction(getattr(agent, "__call__", None))


class AgentWorker:
    """Runs one episode's agent and stops it.

    Args:
        agent: ``agent(task, ctx)``, sync or ``async``.
        episode: The record its calls, variables, rewards and end go to.
        endpoint: Where the agent reaches the gateway (its URL, key and HTTP clients); registered
            with the gateway by :meth:`start`, closed by :meth:`stop`.
    """

    def __init__(self, agent: Callable[..., Any], episode: Episode, endpoint: EpisodeEndpoint) -> None:
        self.agent = agent
        self.episode = episode
        self.endpoint = endpoint
        self.gateway = endpoint.gateway
        # Past GatewayLimits.max_lingering_agents workers blocked in C calls, refuse a new
        # episode (raising here leaves the env's previous episode as it was).
        self.gateway.check_lingering()
        self._thread: threading.Thread | None = None
        self._future: concurrent.futures.Future[None] | None = None  # an async agent's, on the shared loop
        self._task: asyncio.Task[Any] | None = None  # the async agent's task, on the shared loop
        self._escalated = False
        # Guards raising AgentCancelled in the worker against the worker's own exit (a dead
        # thread's id may be reused by another thread, which must never receive it).
        self._raise_lock = threading.Lock()
        self._worker_exiting = False
        episode.call_guard = self.raise_if_stopped

    # ------------------------------------------------------------------ running

    def start(self) -> None:
        """Register the episode with the gateway and start the agent."""
        self.endpoint.open()
        ctx = AgentContext(self.episode, self.endpoint)
        if is_async_agent(self.agent):
            self._future = self.gateway.background_loop().submit(self._run_async(ctx))
        else:
            self._thread = threading.Thread(
                target=self._run_sync, args=(ctx,), name=f"agent-{self.episode.episode_id[:8]}", daemon=True
            )
            self._thread.start()

    def _run_sync(self, ctx: AgentContext) -> None:
        bind_context(ctx)
        try:
            try:
                with episode_trace(self.episode):  # the agent's spans reach its episode
                    result = self.agent(self.episode.trajectory.task, ctx)
            except BaseException as exc:  # noqa: BLE001 - every way out is reported to the driver
                self.episode.finish(None, exc)
            else:
                self.episode.finish(result, None)
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
        bind_context(ctx)
        self._task = asyncio.current_task()
        try:
            with episode_trace(self.episode):
                result = await self.agent(self.episode.trajectory.task, ctx)
        except BaseException as exc:  # noqa: BLE001
            self.episode.finish(None, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        else:
            self.episode.finish(result, None)

    # ------------------------------------------------------------------ stopping

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
        past ``GatewayLimits.max_lingering_agents``). A worker left running is stopped again
        every ``grace`` seconds until it ends (:meth:`_keep_stopping`): a raise can be lost, and
        an agent that catches everything and calls again over its own HTTP client would
        otherwise run on for ever.
        """
        episode = self.episode
        episode.close()
        ok = self._join(grace)
        raised = False
        if not ok:
            self._escalated = True
            ok, raised = self._force_stop(grace)
        if ok and not raised:
            self.endpoint.close_clients(self.gateway.background_loop() if self._future is not None else None)
        else:
            # A worker still running may be using them (an async one may block the loop their
            # close would run on), and a raise at an arbitrary bytecode may have left one of
            # their locks held: closing could block us. Dropped, their sockets close when the
            # clients are collected.
            self.endpoint.drop_clients()
        if not ok:
            where = self._where()
            log.warning(
                "agent of episode %s did not stop within %.1f s (%s); it is left running until that call returns",
                episode.episode_id,
                2 * grace,
                where,
            )
            episode.note_error(
                f"[agentgym] the agent's worker did not stop within {2 * grace:.1f} s: {where}. Python cannot "
                "interrupt a call blocked in C code; AgentCancelled is raised when it returns."
            )
            self.gateway.add_lingering(episode.episode_id, self._thread or self._task or self._future, where)
            threading.Thread(
                target=self._keep_stopping, args=(grace,), name=f"agent-stopper-{episode.episode_id[:8]}", daemon=True
            ).start()
        self.endpoint.close()
        return ok

    def _keep_stopping(self, interval: float) -> None:
        """Stop a worker left running again every ``interval`` seconds until it ends (on a
        thread of its own). Each raise of :class:`AgentCancelled` is lost when it lands inside a
        ``__del__`` (Python only prints it), and an agent over its own HTTP client makes no call
        through this process's guard, so a thread that swallows errors and keeps calling meets
        only these raises; a thread blocked in a C call gets the last one when the call returns."""
        interval = max(interval, 0.05)
        while not self._join(interval):
            self._stop_once()

    def _stop_once(self) -> bool:
        """Raise :class:`AgentCancelled` in the worker's thread once, if it is at a point where
        that is safe (:func:`_safe_to_raise_in`), or cancel its task; False if not now."""
        if self._thread is not None:
            with self._raise_lock:
                ident = self._thread.ident
                if self._worker_exiting or not self._thread.is_alive() or ident is None:
                    return False
                if not _safe_to_raise_in(ident):
                    return False
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(AgentCancelled))
                return True
        if self._task is not None:
            self.gateway.background_loop().loop.call_soon_threadsafe(self._task.cancel)
            return True
        if self._future is not None:
            self._future.cancel()  # the task has not started yet
            return True
        return False

    def _force_stop(self, seconds: float) -> tuple[bool, bool]:
        """``(ended, raised asynchronously)`` after forcing the worker for up to ``seconds``."""
        deadline = time.monotonic() + seconds
        # An agent that keeps calling meets AgentCancelled at its next call: give it a moment.
        if self._join(min(0.1, seconds / 4)):
            return True, False
        raised = 0
        while raised < _MAX_ASYNC_RAISES and time.monotonic() < deadline:
            if self._stop_once():
                raised += 1
            elif self._thread is not None:  # inside the import system or a stdlib lock dance: try again shortly
                if self._join(0.01):
                    return True, raised > 0
                continue
            if self._join(max(0.0, min(seconds / _MAX_ASYNC_RAISES, deadline - time.monotonic()))):
                return True, self._thread is not None and raised > 0
        ended = self._join(max(0.0, deadline - time.monotonic()))
        return ended, self._thread is not None and raised > 0

    def raise_if_stopped(self) -> None:
        """Called at each LLM call the agent makes: once :meth:`stop` has given up waiting, a call
        from the agent's own thread raises :class:`AgentCancelled` right there, at a clean point
        (unlike an asynchronous raise, it cannot land inside a lock or a finalizer)."""
        if self._escalated and self._thread is not None and threading.get_ident() == self._thread.ident:
            raise AgentCancelled(f"episode {self.episode.episode_id} is over: {self.episode.cancel_reason}")

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
            try:
                self._thread.join(timeout)
            except RuntimeError:
                # A Ctrl-C struck start() while it waited for the thread to say it runs: join()
                # refuses such a thread ("cannot join thread before it is started"), which turned
                # an interrupted run's exit 130 into a failure (issue 50 item 8). Not started as
                # far as threading knows: nothing to wait for (a daemon, its episode ended).
                pass
            return not self._thread.is_alive()
        if self._future is not None:
            end = time.monotonic() + timeout
            self.episode.wait_finished(timeout)
            # The task ends just after the agent does (or, cancelled, may outlive the future).
            while not (self._future.done() and (self._task is None or self._task.done())):
                if time.monotonic() >= end:
                    return False
                time.sleep(0.005)
        return True
