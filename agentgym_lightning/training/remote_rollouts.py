"""The trainer's rollouts on Ray workers (``rollout_workers > 0``).

The generator stays in the trainer (the ``hf`` model is trained in place, so every update is
live at once): a :class:`~agentgym_lightning.policies.policy_server.PolicyServer` serves it,
sampling at the training temperature, and each worker's policy is the ``openai`` backend pointed
at it. The workers run the step's plan (the same episodes as in-process, call seeds included);
calls from all workers are batched together into one ``generate``. With an adapter per agent
(``lora_per_agent``) each worker routes its calls (:class:`~.agent_adapters.AdapterRouting`) and
its ``openai`` policy sends the adapter as the request's ``model``, which the trainer's routing
honours: every call reaches the generator with its agent's adapter.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from agentgym_lightning.env import AgentEnv
from agentgym_lightning.training.agent_adapters import AdapterRouting, AgentAdapters
from agentgym_lightning.trajectory import Trajectory

__all__ = ["RemoteRollouts"]


class RemoteRollouts:
    """Serves ``policy`` and runs rollouts of ``env_factory`` on ``config.rollout_workers`` actors."""

    def __init__(self, env_factory: Callable[[], AgentEnv], policy: Any, config: Any, adapters: AgentAdapters | None = None) -> None:
        from agentgym_lightning.policies.openai import OpenAIPolicy
        from agentgym_lightning.policies.policy_server import PolicyServer
        from agentgym_lightning.ray_rollout import RayRolloutRunner

        # Off loopback the server makes up a token (the one rule, gateway/auth.py); the workers send it.
        self.server = PolicyServer(policy, host=config.generation_host).start()
        worker_policy: Callable[[], Any] = functools.partial(
            OpenAIPolicy, "policy", base_url=self.server.base_url, api_key=self.server.token, timeout=config.rollout_worker_timeout
        )
        if adapters is not None:
            worker_policy = functools.partial(_routed, worker_policy, adapters)
        try:
            self.runner = RayRolloutRunner(
                env_factory,
                worker_policy,
                num_workers=config.rollout_workers,
                ray_address=config.ray_address,
                worker_timeout=config.rollout_worker_timeout,
            )
        except BaseException:
            self.server.close()
            raise
        self.retry_infra_failed = config.retry_infra_failed

    def rollout(self, *, episodes: int, group_size: int, concurrency: int, seed: int, tasks: Sequence[Any],
                on_trajectory: Callable[[Trajectory], None]) -> list[Trajectory]:
        return self.runner.rollout(
            episodes=episodes,
            group_size=group_size,
            concurrency=concurrency,
            seed=seed,
            tasks=tasks,
            on_trajectory=on_trajectory,
            retry_infra_failed=self.retry_infra_failed,
        )

    def metrics(self) -> dict[str, float]:
        """The last step's worker faults (``rollout/workers_lost``...)."""
        return self.runner.stats.as_metrics()

    def close(self) -> None:
        self.runner.close()
        self.server.close()


def _routed(policy_factory: Callable[[], Any], adapters: AgentAdapters) -> AdapterRouting:
    """A worker's policy, each call routed to its agent's adapter (picklable as a partial)."""
    return AdapterRouting(policy_factory(), adapters)
