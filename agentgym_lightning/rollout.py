"""The batched driver: run many episodes at once, answering all their pending calls with one
``policy.generate`` per round.

Each round answers every waiting episode (``step_async``) before waiting on any
(``step_wait``), so agents' own work between calls (tools, SQL, retrieval) overlaps. Episodes
come in groups of ``group_size`` on the same task with isolated state (GRPO groups); finished
slots are refilled until ``episodes`` have run.
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from tqdm.auto import tqdm

from agentgym_lightning.env import AgentEnv
from agentgym_lightning.llm import ChatRequest
from agentgym_lightning.spaces import Observation
from agentgym_lightning.trajectory import Status, Trajectory

__all__ = ["rollout", "make_env_factory", "PolicyFn"]

log = logging.getLogger(__name__)

#: Anything with ``generate(requests) -> completions``, or such a function itself.
PolicyFn = Callable[[Sequence[ChatRequest]], Sequence[Any]]

#: Consecutive failed ``generate`` rounds after which the policy is deemed broken.
MAX_POLICY_FAILURES = 3


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


def _generate(policy: Any, requests: list[ChatRequest]) -> list[Any]:
    fn = policy.generate if hasattr(policy, "generate") else policy
    out = list(fn(requests))
    if len(out) != len(requests):
        raise RuntimeError(f"the policy returned {len(out)} completions for {len(requests)} requests")
    return out


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
) -> list[Trajectory]:
    """Run ``episodes`` episodes of ``env`` with ``policy``; returns their trajectories.

    Args:
        env: An env id (``"lightning/Spider-v0"``) or a factory returning an ``AgentEnv``.
        policy: A :class:`~agentgym_lightning.policies.base.Policy`, or any
            ``fn(requests) -> completions``; it gets every pending request of the round at once.
        episodes: How many episodes to run in total.
        group_size: Episodes per task (GRPO groups); they share a ``group_id``.
        concurrency: Episodes running at once (one env each).
        seed: Seeds task sampling (when the env draws tasks) and each episode's reset.
        tasks: Tasks to run, in order (default: the env's own list, in order, or draws from it).
        progress: Show a progress bar.
        on_trajectory: Called with each trajectory as it finishes (write it out here: nothing
            finished is lost if the run is interrupted).
        env_kwargs: Keyword arguments for ``gym.make`` when ``env`` is an id.

    A ``generate`` that raises ends that round's episodes as ``infra_failed``; after
    ``MAX_POLICY_FAILURES`` failed rounds in a row the error is raised. On any exception
    (Ctrl-C included) running episodes are closed (recorded as truncated) before it propagates.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    factory = make_env_factory(env, env_kwargs)
    envs: list[AgentEnv] = [factory()]
    work = _plan(envs[0], episodes, group_size, seed, tasks)
    envs += [factory() for _ in range(min(concurrency, len(work)) - 1)]
    results: list[Trajectory] = []
    pending: dict[int, Observation] = {}
    bar = tqdm(total=len(work), desc="episodes", unit="ep", disable=not progress, dynamic_ncols=True)
    reward_sum = 0.0

    def record(trajectory: Trajectory) -> None:
        nonlocal reward_sum
        results.append(trajectory)
        if on_trajectory is not None:
            on_trajectory(trajectory)
        reward_sum += trajectory.total_reward
        bar.update(1)
        if progress:
            bar.set_postfix(reward=f"{reward_sum / len(results):.3f}", refresh=False)

    def launch(slots: list[int]) -> None:
        """Start the next episodes in ``slots``, all at once, then wait for their first calls."""
        while slots:
            started = []
            for slot in slots:
                if not work:
                    break
                item = work.popleft()
                envs[slot].reset_async(seed=item.seed, options={"task": item.task, "group_id": item.group_id})
                started.append(slot)
            slots = []
            for slot in started:
                obs, info = envs[slot].reset_wait()
                if info.get("episode_over"):
                    # The agent ended before any LLM call: collect it and reuse the slot.
                    record(envs[slot].step_wait()[4]["trajectory"])
                    slots.append(slot)
                else:
                    pending[slot] = obs

    failures = 0
    try:
        launch(list(range(len(envs))))
        while pending:
            slots = list(pending)
            try:
                completions = _generate(policy, [pending[s].request for s in slots])
                failures = 0
            except Exception as exc:  # noqa: BLE001 - a backend fault is the infrastructure's, not the agents'
                failures += 1
                log.error("policy.generate failed (%d in a row): %s", failures, exc)
                for s in slots:
                    *_, info = envs[s].abort(f"policy backend failed: {exc!r}", Status.INFRA_FAILED)
                    del pending[s]
                    record(info["trajectory"])
                if failures >= MAX_POLICY_FAILURES:
                    raise
                launch(slots)
                continue
            for s, completion in zip(slots, completions):
                envs[s].step_async(completion)
            free = []
            for s in slots:
                obs, _, terminated, truncated, info = envs[s].step_wait()
                if terminated or truncated:
                    del pending[s]
                    record(info["trajectory"])
                    free.append(s)
                else:
                    pending[s] = obs
            launch(free)
    finally:
        for e in envs:
            e.close()
        bar.close()
    return results

