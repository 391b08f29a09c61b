"""``--env verifiers:MODULE``: a verifiers environment (its classic API) as an ``AgentEnv``.

    agentgym-lightning train --env verifiers:my_env --env-kwarg num_train_examples=500 \\
        --eval-env-kwarg split=eval

    env = gym.make("lightning/Verifiers-v0", environment="my_env", split="eval")

``MODULE``'s ``load_environment(**kwargs)`` (:mod:`.load`) builds the environment once per env;
every ``--env-kwarg`` goes to it, except the :class:`~agentgym_lightning.env.AgentEnv` options
(``air_weights``, ``time_limit``, ``max_turns``...) and ``split``: ``"train"`` (its ``dataset``,
the default) or ``"eval"`` (its ``eval_dataset``, the held-out split). Each episode is one rollout
of one row (:mod:`.agent`), its final reward the rubric's.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from agentgym_lightning.env import AgentEnv

from .agent import VerifiersAgent
from .errors import VerifiersLoadError
from .load import load_environment

__all__ = ["VERIFIERS_ID", "AGENT_ENV_OPTIONS", "rubric_reward", "make_env"]

VERIFIERS_ID = "lightning/Verifiers-v0"

#: The keyword arguments that are ``AgentEnv``'s; every other one is ``load_environment``'s.
AGENT_ENV_OPTIONS: frozenset[str] = frozenset(inspect.signature(AgentEnv.__init__).parameters) - {"self", "agent", "tasks", "reward_fn"}


def rubric_reward(task: Mapping[str, Any], result: Mapping[str, Any]) -> float:
    """The episode's final reward: the rubric's weighted sum (:class:`.agent.RubricScore`)."""
    return float(result["reward"])


def make_env(environment: str, split: str = "train", **kwargs: Any) -> AgentEnv:
    """The env of verifiers environment module ``environment`` on its ``split`` (``"train"``:
    ``dataset``; ``"eval"``: ``eval_dataset``). Raises
    :class:`~.errors.VerifiersLoadError` for a module that cannot be loaded, a split it
    does not have, or a rubric with group-level reward functions."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' (the dataset) or 'eval' (the eval_dataset), not {split!r}")
    options = {k: kwargs.pop(k) for k in list(kwargs) if k in AGENT_ENV_OPTIONS}
    name = f"verifiers:{environment}"
    loaded = load_environment(environment, kwargs)
    if loaded.rubric.has_group_rewards:
        raise VerifiersLoadError(
            f"{name}: its rubric has group-level reward functions (scored over a group of rollouts at once), "
            "which this env does not run yet; give each function one rollout's arguments (prompt, completion, answer, state)"
        )
    try:
        rows = loaded.get_dataset() if split == "train" else loaded.get_eval_dataset()
    except ValueError as exc:
        raise VerifiersLoadError(
            f"{name}: it has no {'dataset' if split == 'train' else 'eval_dataset'} ({exc}); "
            f"give load_environment one, or use split={'eval' if split == 'train' else 'train'}"
        ) from None
    options.setdefault("env_id", name)
    return AgentEnv(VerifiersAgent(loaded, name), [dict(row) for row in rows], rubric_reward, **options)
