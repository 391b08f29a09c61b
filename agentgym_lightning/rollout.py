"""The batched driver: run many episodes at once, answering their pending calls in batches with
``policy.generate``.

How it drives (continuous batching):

- Every env tells the driver when its agent has called or ended
  (:meth:`~agentgym_lightning.env.AgentEnv.set_ready_callback`), and the driver takes whichever
  env is ready first (``step_wait(timeout=0)``): no agent ever waits for another one, and an agent
  that hangs costs only its own episode (it is truncated at its ``time_limit``).
- Pending calls are batched. A batch goes to ``policy.generate`` as soon as every running agent
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

When ``generate`` raises, the batch is split in halves and retried until the requests that fail
alone are found: the others are answered as usual, and each culprit's call gets an OpenAI-style
400 error (the agent decides what to do, as with any API error). When no request of a batch
succeeds, the last request that did is generated again as a probe: if it succeeds, the backend is
healthy and the failures are the requests' own (400s); if it fails (or there is none yet), the
backend is down: the batch's episodes end ``infra_failed``, and after ``MAX_POLICY_FAILURES`` such
batches in a row the error is raised.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import queue
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import gymnasium as gym
import numpy as np
from tqdm.auto import tqdm

from agentgym_lightning.env import AgentEnv
from agentgym_lightning.gateway.openai_wire import GatewayError
from agentgym_lightning.llm import ChatRequest
from agentgym_lightning.spaces import Observation
from agentgym_lightning.trajectory import Status, Trajectory

__all__ = ["rollout", "make_env_factory", "PolicyFn", "MAX_POLICY_FAILURES", "DEFAULT_MAX_BATCH_WAIT", "BATCH_WAIT_FRACTION"]

log = logging.getLogger(__name__)

#: Anything with ``generate(requests) -> completions``, or such a function itself.
PolicyFn = Callable[[Sequence[ChatRequest]], Sequence[Any]]

#: Consecutive batches failed by the backend (not by a request) after which it is deemed broken.
MAX_POLICY_FAILURES = 3
#: Seconds the oldest pending call may wait for more calls to join its batch, at most.
DEFAULT_MAX_BATCH_WAIT = 0.05
#: ...and at most this fraction of the last ``generate``'s duration.
BATCH_WAIT_FRACTION = 0.1


def make_env_factory(env: str | Callable[[], AgentEnv], env_kwargs: Mapping[str, Any] | None = None) -> Callable[[], AgentEnv]:
    """A zero-argument factory from an env id (``gym.make``) or a factory."""
    if isinstance(env, str):
        import agentgym_lightning  # noqa: F401 - registers the lightning/... ids

        kwargs = dict(env_kwargs or {})

        def factory() -> AgentEnv:
            made = gym.make(env, **kwargs)
            if not isinstance(made.unwrapped, AgentEnv):
                raise TypeError(f"{env} is not an agentgym-lightning AgentEnv")
            return made.unwrapped

        return factory
    if env_kwargs:
        raise ValueError("env_kwargs only apply to an env id; bake them into your factory instead")
    return env


@dataclass
class _Work:
    task: Any
    group_id: str
    seed: int


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


class _Slot(Enum):
    IDLE = "idle"  # no episode (none left to run)
    STARTING = "starting"  # reset_async done; waiting for the agent's first call
    RUNNING = "running"  # answered; waiting for the agent's next call or end
    PENDING = "pending"  # a call waits for the policy


class _PolicyDown(Exception):
    """The backend failed requests that it answered before: it is the infrastructure."""


class _Batcher:
    """Answers a batch of requests; isolates the requests a backend rejects (see module doc)."""

    def __init__(self, policy: Any) -> None:
        self._generate_fn = policy.generate if hasattr(policy, "generate") else policy
        self._probe: ChatRequest | None = None  # a request the backend answered before
        self.failures = 0  # consecutive batches the backend failed

    def _call(self, requests: list[ChatRequest]) -> list[Any]:
        out = list(self._generate_fn(requests))
        if len(out) != len(requests):
            raise RuntimeError(f"the policy returned {len(out)} completions for {len(requests)} requests")
        return out

    def _bisect(self, requests: list[ChatRequest]) -> list[Any]:
        """Completions, with the exception in place of each request that fails on its own."""
        try:
            return self._call(requests)
        except Exception as exc:  # noqa: BLE001 - sorted out below: a request's or the backend's
            if len(requests) == 1:
                return [exc]
            log.warning("policy.generate failed for a batch of %d (%s); retrying in halves", len(requests), exc)
            mid = len(requests) // 2
            return self._bisect(requests[:mid]) + self._bisect(requests[mid:])

    def _backend_healthy(self) -> bool:
        if self._probe is None:
            return False
        probe = dataclasses.replace(self._probe, sampling=dataclasses.replace(self._probe.sampling, max_tokens=1))
        try:
            self._call([probe])
        except Exception as exc:  # noqa: BLE001
            log.error("policy.generate failed a request it answered before: %s", exc)
            return False
        return True

    def answer(self, requests: list[ChatRequest]) -> list[Any]:
        """One completion or :class:`GatewayError` (400: the backend rejected that request) per
        request; raises :class:`_PolicyDown` (with the error as its cause) when the backend
        itself failed."""
        results = self._bisect(requests)
        errors = [r for r in results if isinstance(r, Exception)]
        if len(errors) < len(results):
            self._probe = requests[next(i for i, r in enumerate(results) if not isinstance(r, Exception))]
        elif not self._backend_healthy():
            self.failures += 1
            raise _PolicyDown(str(errors[0])) from errors[0]
        self.failures = 0
        return [
            GatewayError(400, f"the policy backend rejected this request: {r}", code="invalid_request_error")
            if isinstance(r, Exception)
            else r
            for r in results
        ]


class _Driver:
    """The state of one :func:`rollout` call (see the module docstring for the rules)."""

    def __init__(
        self,
        envs: list[AgentEnv],
        work: deque[_Work],
        batcher: _Batcher,
        record: Callable[[Trajectory], None],
        max_batch_wait: float | None,
        max_batch_size: int | None,
    ) -> None:
        self.envs = envs
        self.work = work
        self.batcher = batcher
        self.record = record
        self.max_batch_wait = max_batch_wait
        self.max_batch_size = max_batch_size
        self.state = [_Slot.IDLE] * len(envs)
        self.ready: queue.SimpleQueue[int] = queue.SimpleQueue()
        #: Slots whose call waits for the policy, oldest first, with the call's arrival time.
        self.pending: dict[int, tuple[Observation, float]] = {}
        self.waiting_on_agents = 0  # slots STARTING or RUNNING
        self.deadlines: list[tuple[float, int, int]] = []  # (deadline, episode serial, slot)
        self.serial = [0] * len(envs)
        self.batch_wait = 0.0 if max_batch_wait is None else max_batch_wait  # updated per generate
        for slot, env in enumerate(envs):
            env.set_ready_callback(lambda slot=slot: self.ready.put(slot))

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        for slot in range(len(self.envs)):
            self._start(slot)
        while self.waiting_on_agents or self.pending:
            if self.pending and self._batch_due():
                self._generate()
                continue
            self._wait_for_agents()

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
        if self.pending and self.max_batch_wait is not None:
            until.append(next(iter(self.pending.values()))[1] + self.batch_wait)
        try:
            slot: int | None = self.ready.get(timeout=max(0.0, min(until) - now) if until else None)
        except queue.Empty:
            slot = None
        while slot is not None:
            self._poll(slot)
            try:
                slot = self.ready.get_nowait()
            except queue.Empty:
                slot = None
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

    def _finish(self, slot: int, trajectory: Trajectory) -> None:
        self.serial[slot] += 1  # its deadline entry is stale now
        self.record(trajectory)
        self._start(slot)

    def _generate(self) -> None:
        slots = list(self.pending)[: self.max_batch_size or None]
        started = time.monotonic()
        try:
            answers = self.batcher.answer([self.pending[s][0].request for s in slots])
        except _PolicyDown as exc:
            cause = exc.__cause__ or exc
            log.error("policy.generate failed (%d batches in a row): %s", self.batcher.failures, cause)
            for slot in slots:
                del self.pending[slot]
                *_, info = self.envs[slot].abort(f"policy backend failed: {cause!r}", Status.INFRA_FAILED)
                self._finish(slot, info["trajectory"])
            if self.batcher.failures >= MAX_POLICY_FAILURES:
                raise cause from None
            return
        if self.max_batch_wait is not None:
            self.batch_wait = min(self.max_batch_wait, BATCH_WAIT_FRACTION * (time.monotonic() - started))
        for slot, answer in zip(slots, answers):
            del self.pending[slot]
            env = self.envs[slot]
            env.step_async(answer)
            if env.deadline is not None:  # answering moved it on by the time the call waited
                heapq.heappush(self.deadlines, (env.deadline, self.serial[slot], slot))
            self.state[slot] = _Slot.RUNNING
            self.waiting_on_agents += 1
            self.ready.put(slot)  # its agent may have called again already (parallel calls)


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
    order they finished.

    Args:
        env: An env id (``"lightning/Spider-v0"``) or a factory returning an ``AgentEnv``.
        policy: A :class:`~agentgym_lightning.policies.base.Policy`, or any
            ``fn(requests) -> completions``; it gets the pending requests in batches.
        episodes: How many episodes to run in total.
        group_size: Episodes per task (GRPO groups); they share a ``group_id``.
        concurrency: Episodes running at once (one env each).
        seed: Seeds task sampling (when the env draws tasks) and each episode's reset.
        tasks: Tasks to run, in order (default: the env's own list, in order, or draws from it).
        progress: Show a progress bar.
        on_trajectory: Called with each trajectory as it finishes (write it out here: nothing
            finished is lost if the run is interrupted).
        env_kwargs: Keyword arguments for ``gym.make`` when ``env`` is an id.
        max_batch_wait: Seconds the oldest pending call may wait for others to join its batch
            (and never more than ``BATCH_WAIT_FRACTION`` of the last ``generate``'s duration);
            ``None`` waits for every running agent (lock-step rounds). See the module docstring.
        max_batch_size: Most calls per ``generate`` (default: every pending call).

    A request the backend rejects fails only its own call (an OpenAI 400 to that agent); a
    backend that fails every request ends those episodes ``infra_failed`` and, after
    ``MAX_POLICY_FAILURES`` batches in a row, raises. On any exception (Ctrl-C included) running
    episodes are closed (recorded as truncated) before it propagates.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if max_batch_wait is not None and max_batch_wait < 0:
        raise ValueError(f"max_batch_wait must be >= 0 seconds or None, got {max_batch_wait}")
    if max_batch_size is not None and max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1 or None, got {max_batch_size}")
    factory = make_env_factory(env, env_kwargs)
    envs: list[AgentEnv] = [factory()]
    work = _plan(envs[0], episodes, group_size, seed, tasks)
    envs += [factory() for _ in range(min(concurrency, len(work)) - 1)]
    results: list[Trajectory] = []
    # No bar, no tqdm at all: even a disabled one starts tqdm's monitor thread.
    bar = tqdm(total=len(work), desc="episodes", unit="ep", dynamic_ncols=True) if progress else None
    reward_sum = 0.0

    def record(trajectory: Trajectory) -> None:
        nonlocal reward_sum
        results.append(trajectory)
        if on_trajectory is not None:
            on_trajectory(trajectory)
        reward_sum += trajectory.total_reward
        if bar is not None:
            bar.update(1)
            bar.set_postfix(reward=f"{reward_sum / len(results):.3f}", refresh=False)

    try:
        _Driver(envs, work, _Batcher(policy), record, max_batch_wait, max_batch_size).run()
    finally:
        for e in envs:
            e.set_ready_callback(None)
            e.close()
        if bar is not None:
            bar.close()
    return results
