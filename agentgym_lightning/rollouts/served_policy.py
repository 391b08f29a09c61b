"""The trainer's rollouts on Ray workers (``rollout_workers > 0``): its generator served to them.

The generator stays in the trainer (the ``hf`` model is trained in place, so every update is
live at once): a :class:`~agentgym_lightning.policies.policy_server.PolicyServer` serves it,
sampling at the training temperature, and each worker's policy is the ``openai`` backend pointed
at it. The workers run the step's plan (the same episodes as in-process, call seeds included);
calls from all workers are batched together into one ``generate``. With an adapter per agent
(``lora_per_agent``) the trainer passes ``wrap_worker_policy`` (its adapter routing): each
worker routes its calls and its ``openai`` policy sends the adapter as the request's ``model``,
which the trainer's routing honours: every call reaches the generator with its agent's adapter.

Each answer carries the policy version that wrote it (``Completion.policy_version``, stamped in
the trainer by :class:`~agentgym_lightning.training.generation.VersionStamping`) in the
response's ``policy_version`` field, which the worker's ``openai`` policy reads back: the
worker's episode records it as ``Step.policy_version``, as an episode in this process does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from agentgym_lightning.env import AgentEnv
from agentgym_lightning.rollouts.base import Rollouts
from agentgym_lightning.rollouts.ray_workers import RayRolloutStream

__all__ = ["ServedPolicyRollouts"]


class ServedPolicyRollouts(Rollouts):
    """Serves ``policy`` and runs rollouts of ``env_factory`` on ``workers`` Ray actors.

    Args:
        env_factory: A (picklable) factory returning an ``AgentEnv``; built in each worker.
        policy: What answers every worker's calls, served from this process.
        workers: Ray actors to run the episodes on.
        host: Address the policy server binds (off loopback it makes up a token, which the
            workers send: the one rule, ``gateway/auth.py``).
        ray_address: An existing Ray cluster, or ``None`` for a local one.
        worker_timeout: Seconds a worker may go without a finished episode (and each of its
            calls may take) before it is deemed hung.
        retry_infra_failed: Run the episodes lost with a worker once more.
        wrap_worker_policy: A picklable ``fn(policy) -> policy`` each worker applies to its
            ``openai`` policy (the trainer's adapter routing).
    """

    def __init__(
        self,
        env_factory: Callable[[], AgentEnv],
        policy: Any,
        *,
        workers: int,
        host: str = "127.0.0.1",
        ray_address: str | None = None,
        worker_timeout: float = 600.0,
        retry_infra_failed: bool = False,
        wrap_worker_policy: Callable[[Any], Any] | None = None,
    ) -> None:
        from agentgym_lightning.policies.openai import OpenAIPolicy
        from agentgym_lightning.policies.policy_server import PolicyServer
        from agentgym_lightning.rollouts.ray_workers import RayRolloutRunner

        self.server = PolicyServer(policy, host=host).start()
        worker_policy: Callable[[], Any] = functools.partial(
            OpenAIPolicy, "policy", base_url=self.server.base_url, api_key=self.server.token, timeout=worker_timeout
        )
        if wrap_worker_policy is not None:
            worker_policy = functools.partial(_wrapped, worker_policy, wrap_worker_policy)
        try:
            self.runner = RayRolloutRunner(
                env_factory,
                worker_policy,
                num_workers=workers,
                ray_address=ray_address,
                worker_timeout=worker_timeout,
                retry_infra_failed=retry_infra_failed,
            )
        except BaseException:
            self.server.close()
            raise

    def iter_rollout(
        self,
        *,
        episodes: int,
        group_size: int = 1,
        concurrency: int = 8,
        seed: int = 0,
        tasks: Sequence[Any] | None = None,
    ) -> RayRolloutStream:
        return self.runner.iter_rollout(episodes=episodes, group_size=group_size, concurrency=concurrency, seed=seed, tasks=tasks)

    def metrics(self) -> dict[str, float]:
        """The worker faults since the last call (``rollout/workers_lost``...): the last
        rollout's when called once per step, and those of every rollout that ran during the
        step when rollouts run on beside the update (``max_staleness`` >= 1)."""
        return self.runner.take_stats().as_metrics()

    def close(self) -> None:
        self.runner.close()
        self.server.close()


def _wrapped(policy_factory: Callable[[], Any], wrap: Callable[[Any], Any]) -> Any:
    """A worker's policy, wrapped (picklable as a partial)."""
    return wrap(policy_factory())
