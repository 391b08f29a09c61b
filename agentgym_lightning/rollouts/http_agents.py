"""The HTTP driver (the standalone gateway): episodes whose agents run somewhere else.

An agent in another process, container or machine, in any language, takes part in rollouts
through five HTTP calls (all JSON; ``Authorization: Bearer <token>`` on every one when the server
has a token, which it always has off loopback)::

    POST /episodes                      {"task": ..., "group_id"?: "g1", "seed"?: 7}
                                        -> {"episode_id", "base_url", "anthropic_base_url", "api_key"}
    POST {base_url}/chat/completions    the agent's LLM calls (any OpenAI client; or /responses,
                                        /completions, or an Anthropic client's /v1/messages at
                                        anthropic_base_url), answered by the server's policy,
                                        batched with everyone else's
    POST /episodes/{id}/rewards         {"value": 1.0, "source": "judge"}
    POST /episodes/{id}/variables       {"name": value, ...}
    POST /episodes/{id}/done            {"result": ..., "reward"?: 1.0, "error"?: "..."}
                                        -> the finished trajectory
    GET  /episodes/{id}/trajectory      the finished trajectory (steps with token ids and
                                        logprobs); 409 while it runs, 404 when unknown

Each episode is an :class:`~agentgym_lightning.env.AgentEnv` episode whose agent is a stand-in
that waits for ``done`` (released by the env's ``on_end`` however the episode ends; its final
reward is the env's ``trajectory_reward``: what ``done`` carried): the same gateway, batching
(:class:`~agentgym_lightning.rollouts.in_process.RolloutStream`),
statuses and trajectories as local agents. ``done`` with a ``reward`` sets the final reward;
with an ``error`` the episode ends ``task_failed`` (final reward 0). An agent that goes silent
is truncated on its own once it has used ``agent_time_limit`` seconds of its own time (time its
calls wait for the policy does not count); nobody else waits for it.

In Python (the trainer consumes these episodes like local ones)::

    with StandaloneGateway(policy, port=8000) as server:
        batch = server.take(16, timeout=600)          # the next 16 finished trajectories
        trainer.update(trainer.samples(batch))  # rows as the trainer's config builds them

From the shell: ``agentgym-lightning serve --backend openai --base-url http://gpu:8000/v1``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agentgym_lightning.env import AgentEnv
from agentgym_lightning.gateway.gateway import Gateway
from agentgym_lightning.gateway.openai_wire import ERROR_HEADERS, GatewayError, error_body
from agentgym_lightning.reward_bounds import RewardRefused, checked_reward
from agentgym_lightning.rollouts.in_process import DEFAULT_MAX_BATCH_WAIT, RolloutStream
from agentgym_lightning.trajectory import Trajectory, TrajectoryWriter

__all__ = ["StandaloneGateway", "RemoteAgentError", "REMOTE_ENV_ID"]

log = logging.getLogger(__name__)

#: The ``env_id`` recorded on remote episodes.
REMOTE_ENV_ID = "remote"


class RemoteAgentError(Exception):
    """The remote agent reported an error with ``done`` (the episode ends ``task_failed``)."""


class StandaloneGateway:
    """Serves episodes to remote agents over HTTP (see the module docstring for the API).

    Args:
        policy: What answers the agents' calls (any :class:`~agentgym_lightning.policies.Policy`
            or ``fn(requests) -> completions``), in batches.
        host: Address to bind; off loopback a bearer token is required (one is generated when
            ``token`` is not given: read :attr:`token`).
        port: Port to bind (0: a free one; read :attr:`url`).
        token: The bearer token clients must send.
        concurrency: Episodes open at once; an ``open`` beyond that waits up to
            ``open_timeout`` seconds for one to finish, then gets a 503.
        agent_time_limit: Seconds of its own time a remote agent may take in an episode (time
            waiting for the policy does not count); past it the episode ends ``truncated``.
        max_turns: Most LLM calls per episode (``None``: no limit).
        output: A JSONL file every finished trajectory is appended to.
        keep: Finished trajectories kept in memory for ``GET .../trajectory`` (oldest dropped).
        keep_bytes: The most bytes of JSON those kept trajectories may hold together (oldest
            dropped first; the newest is always kept, so its ``done`` can answer with it).
        open_timeout: See ``concurrency``.
        max_batch_wait: As in :func:`~agentgym_lightning.rollouts.in_process.rollout`.
    """

    def __init__(
        self,
        policy: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        concurrency: int = 256,
        agent_time_limit: float | None = 300.0,
        max_turns: int | None = None,
        output: str | Path | None = None,
        keep: int = 10_000,
        keep_bytes: int = 512 * 2**20,
        open_timeout: float = 60.0,
        max_batch_wait: float | None = DEFAULT_MAX_BATCH_WAIT,
    ) -> None:
        routes = [
            Route("/episodes", self._guard(self._open), methods=["POST"]),
            Route("/episodes/{episode_id}/done", self._guard(self._done), methods=["POST"]),
            Route("/episodes/{episode_id}/trajectory", self._guard(self._trajectory), methods=["GET"]),
            Route("/health", self._health, methods=["GET"]),  # before the gateway's own: it knows the driver
        ]
        self.gateway = Gateway(host=host, port=port, token=token, extra_routes=routes)
        self.keep = keep
        self.keep_bytes = keep_bytes
        self.open_timeout = open_timeout
        self._outcomes: dict[str, concurrent.futures.Future[Any]] = {}
        self._final_rewards: dict[str, float | None] = {}
        self._running: set[str] = set()
        #: Finished trajectories as the JSON their routes answer with, oldest first, and its total size.
        self._finished: OrderedDict[str, bytes] = OrderedDict()
        self._finished_bytes = 0
        self._lock = threading.Lock()
        self._finished_changed = threading.Condition(self._lock)
        self._queue: queue.SimpleQueue[Trajectory] = queue.SimpleQueue()
        self._writer = TrajectoryWriter(output, append=True) if output is not None else None
        def remote_env() -> AgentEnv:
            return AgentEnv(
                self._remote_agent,
                tasks=[None],
                env_id=REMOTE_ENV_ID,
                time_limit=agent_time_limit,
                max_turns=max_turns,
                transport="http",
                gateway=self.gateway,
                trajectory_reward=self._final_reward,
                on_end=self._release,
            )

        self._stream = RolloutStream(remote_env, policy, concurrency=concurrency, max_batch_wait=max_batch_wait)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        #: Episodes opened and finished since start (for logs).
        self.opened = 0
        self.finished = 0

    # ------------------------------------------------------------------ lifecycle

    @property
    def token(self) -> str | None:
        return self.gateway.token

    @property
    def url(self) -> str:
        """The server's root URL (``POST {url}/episodes`` opens an episode)."""
        return self.gateway.url

    def start(self) -> StandaloneGateway:
        """Bind the server and start driving episodes; returns once it accepts connections."""
        if self._thread is None:
            self.gateway.start()
            self._thread = threading.Thread(target=self._drive, name="agentgym-standalone", daemon=True)
            self._thread.start()
        return self

    def _drive(self) -> None:
        try:
            for trajectory in self._stream:
                self._record(trajectory)
        except BaseException as exc:  # noqa: BLE001 - reported by take() and the open route
            log.exception("the standalone gateway stopped driving episodes")
            self._error = exc

    def _record(self, trajectory: Trajectory) -> None:
        with self._lock:
            self._running.discard(trajectory.episode_id)
            self._outcomes.pop(trajectory.episode_id, None)
            self._final_rewards.pop(trajectory.episode_id, None)
            text = trajectory.to_json().encode()
            self._finished[trajectory.episode_id] = text
            self._finished_bytes += len(text)
            while len(self._finished) > 1 and (len(self._finished) > self.keep or self._finished_bytes > self.keep_bytes):
                self._finished_bytes -= len(self._finished.popitem(last=False)[1])
            self.finished += 1
            self._finished_changed.notify_all()
        if self._writer is not None:
            self._writer.write(trajectory)
        self._queue.put(trajectory)

    def close(self) -> None:
        """End every running episode (truncated), then stop the server."""
        if self._thread is not None:
            self._stream.stop()  # the driving thread ends the episodes and records them
            self._thread.join(30)
        self._stream.close()
        self.gateway.close()
        if self._writer is not None:
            self._writer.close()

    def __enter__(self) -> StandaloneGateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ for the trainer

    def take(self, n: int, timeout: float | None = None) -> list[Trajectory]:
        """The next ``n`` finished trajectories, in the order they finished; raises
        :class:`TimeoutError` (keeping nothing back: call again) when fewer arrive in time."""
        out: list[Trajectory] = []
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(out) < n:
            if self._error is not None:
                raise RuntimeError(f"the standalone gateway stopped: {self._error!r}") from self._error
            wait = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
            if wait <= 0:
                for t in reversed(out):  # give them back, in order, for the next call
                    self._requeue(t)
                raise TimeoutError(f"only {len(out)} of {n} episodes finished within {timeout} s")
            try:
                out.append(self._queue.get(timeout=wait))
            except queue.Empty:
                continue
        return out

    def _requeue(self, trajectory: Trajectory) -> None:
        rest = []
        while True:
            try:
                rest.append(self._queue.get_nowait())
            except queue.Empty:
                break
        self._queue.put(trajectory)
        for t in rest:
            self._queue.put(t)

    # ------------------------------------------------------------------ the remote agent's stand-in

    def _outcome(self, episode_id: str) -> concurrent.futures.Future[Any]:
        with self._lock:
            fut = self._outcomes.get(episode_id)
            if fut is None:
                fut = self._outcomes[episode_id] = concurrent.futures.Future()
            return fut

    async def _remote_agent(self, task: Any, ctx: Any) -> Any:
        """Runs in the episode for the remote agent: waits for its ``done``."""
        return await asyncio.wrap_future(self._outcome(ctx.episode_id))

    def _final_reward(self, trajectory: Trajectory) -> float | None:
        """The final reward the remote agent's ``done`` carried (``None`` without one: only
        posted rewards count)."""
        return self._final_rewards.pop(trajectory.episode_id, None)

    def _release(self, episode_id: str) -> None:
        """However the episode ends (truncated, closed), release its stand-in at once: it would
        otherwise hold the driver for the env's stop grace."""
        self._outcome(episode_id).cancel()

    # ------------------------------------------------------------------ routes

    def _guard(self, handler: Any) -> Any:
        async def endpoint(request: Request) -> Response:
            try:
                self.gateway.check_auth(request.headers.get("authorization"))
                return await handler(request)
            except GatewayError as exc:
                return JSONResponse(
                    error_body(exc.status, exc.message, exc.code), status_code=exc.status, headers=ERROR_HEADERS
                )

        return endpoint

    async def _open(self, request: Request) -> Response:
        body = self.gateway.json_object(await request.body() or b"{}")
        if self._error is not None:
            raise GatewayError(503, f"the gateway stopped driving episodes: {self._error!r}", "server_error")
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
            raise GatewayError(400, f"'seed' must be an integer in [0, 2**63), got {seed!r:.40}")
        group_id = body.get("group_id")
        started: concurrent.futures.Future[str] = concurrent.futures.Future()

        def on_start(env: AgentEnv | None) -> None:
            if not started.set_running_or_notify_cancel():
                # The opener gave up waiting (see below): nobody will drive this episode, so its
                # stand-in ends it at once (no calls were made: nothing in it is trained on).
                if env is not None and env.episode_id is not None:
                    self._outcome(env.episode_id).set_exception(RemoteAgentError("its opener gave up waiting for a slot"))
                return
            if env is None:
                started.set_exception(GatewayError(503, "the gateway is shutting down", "server_error"))
                return
            assert env.episode_id is not None
            with self._lock:
                self._running.add(env.episode_id)
                self.opened += 1
            started.set_result(env.episode_id)

        self._stream.submit(body.get("task"), group_id=None if group_id is None else str(group_id), seed=seed, on_start=on_start)
        try:
            episode_id = await asyncio.wait_for(asyncio.wrap_future(started), self.open_timeout)
        except TimeoutError:
            raise GatewayError(
                503, f"every episode slot stayed busy for {self.open_timeout} s; retry later", "server_error"
            ) from None
        return JSONResponse(
            {
                "episode_id": episode_id,
                "base_url": self.gateway.base_url(episode_id),
                "anthropic_base_url": self.gateway.anthropic_base_url(episode_id),
                "api_key": self.gateway.api_key,
            }
        )

    async def _done(self, request: Request) -> Response:
        episode_id = request.path_params["episode_id"]
        body = self.gateway.json_object(await request.body() or b"{}")
        with self._lock:
            running = episode_id in self._running
        if not running:
            raise GatewayError(
                409 if episode_id in self._finished else 404,
                f"episode {episode_id!r} is not running (it ended, or never existed)",
                "episode_closed",
            )
        reward = body.get("reward")
        if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
            raise GatewayError(400, f"'reward' must be a number, got {reward!r:.40}")
        error = body.get("error")
        refused = None
        if reward is not None:
            try:
                reward = checked_reward(reward, "a remote agent's done")
            except RewardRefused as exc:
                # The episode ends now, excluded from training (infra_failed), and the agent hears why.
                refused, reward = str(exc), None
                self.gateway.episode(episode_id).refuse_reward(refused)
        with self._lock:
            self._final_rewards[episode_id] = reward
        outcome = self._outcome(episode_id)
        if not outcome.done():
            if error:
                outcome.set_exception(RemoteAgentError(str(error)))
            else:
                outcome.set_result(body.get("result"))
        trajectory = await asyncio.to_thread(self._wait_finished, episode_id, 30.0)
        if refused is not None:
            raise GatewayError(400, refused)
        if trajectory is None:
            raise GatewayError(504, f"episode {episode_id} did not finish within 30 s of done", "timeout")
        return Response(trajectory, media_type="application/json")

    async def _health(self, request: Request) -> Response:
        """``GET /health`` (no token): 200 while episodes are driven, 503 once the driver stopped."""
        if self._error is not None:
            return JSONResponse({"ok": False, "error": f"the gateway stopped driving episodes: {self._error!r}"}, status_code=503)
        return JSONResponse({"ok": True, "episodes": len(self._running), "finished": self.finished})

    def _wait_finished(self, episode_id: str, timeout: float) -> bytes | None:
        with self._finished_changed:
            self._finished_changed.wait_for(lambda: episode_id in self._finished, timeout)
            return self._finished.get(episode_id)

    async def _trajectory(self, request: Request) -> Response:
        episode_id = request.path_params["episode_id"]
        with self._lock:
            trajectory = self._finished.get(episode_id)
            running = episode_id in self._running
        if trajectory is None:
            if running:
                raise GatewayError(409, f"episode {episode_id} is still running", "episode_running")
            raise GatewayError(
                404,
                f"no finished episode {episode_id!r} (unknown, or dropped: only the last {self.keep} are kept, "
                f"{self.keep_bytes} bytes at most)",
            )
        return Response(trajectory, media_type="application/json")


