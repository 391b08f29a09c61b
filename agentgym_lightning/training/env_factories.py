"""The envs a training run makes: its training env (every call seeded, the run's AIR weights
merged into the env's) and its held-out one. Shared by the RL trainer and the SFT trainer, so both
roll out the same episodes for the same options."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentgym_lightning.env import AgentEnv
from agentgym_lightning.registration import is_file_factory, make_env_factory

__all__ = ["TrainingEnvFactory", "training_env_factory", "held_out_env_factory"]


@dataclass(frozen=True)
class TrainingEnvFactory:
    """A run's training env factory (:func:`training_env_factory`): calling it builds an env with
    :attr:`kwargs`, every call of its episodes seeded, and :attr:`air_weights` over its own."""

    build: Callable[[], AgentEnv]
    #: The keyword arguments the env is built with: ``env_kwargs``, and for an env id the run's AIR
    #: weights merged into their ``air_weights``. What its creator refuses (``env_kwargs_refused``).
    kwargs: dict[str, Any]
    #: The run's AIR weights set over the built env's own (a factory's: it need not take them).
    air_weights: dict[str, float] = field(default_factory=dict)

    def __call__(self) -> AgentEnv:
        env = self.build()
        env.seed_calls = True
        if self.air_weights:
            env.air_weights = {**env.air_weights, **{k: float(v) for k, v in self.air_weights.items()}}
        return env


def training_env_factory(
    target: str | Callable[[], AgentEnv], env_kwargs: Mapping[str, Any], air_weights: Mapping[str, float]
) -> TrainingEnvFactory:
    """The training env of ``target`` (an env id, a ``file.py:make_env`` or a factory) with
    ``env_kwargs``: every call of its episodes seeded from the episode (reproducible), and
    ``air_weights`` over the env's own."""
    kwargs = dict(env_kwargs)
    if isinstance(target, str) and not is_file_factory(target):
        if air_weights:
            kwargs["air_weights"] = {**dict(kwargs.get("air_weights") or {}), **air_weights}
        return TrainingEnvFactory(make_env_factory(target, kwargs), kwargs)
    # A factory (the caller's, its kwargs baked in, or a file's) need not take air_weights: they
    # are merged into the env it returns instead.
    factory = make_env_factory(target, kwargs) if isinstance(target, str) else make_env_factory(target)
    return TrainingEnvFactory(factory, kwargs if isinstance(target, str) else {}, dict(air_weights))


def held_out_env_factory(
    env: str, env_kwargs: Mapping[str, Any], eval_env_kwargs: Mapping[str, Any] | None,
    given: str | Callable[[], AgentEnv] | None = None,
) -> Callable[[], AgentEnv] | None:
    """The held-out env: ``given`` (an id or a factory), else ``env`` with ``env_kwargs`` and
    ``eval_env_kwargs`` over them; ``None`` when neither is given (no evaluation)."""
    if given is not None:
        return make_env_factory(given)
    if eval_env_kwargs is not None:
        return make_env_factory(env, {**env_kwargs, **eval_env_kwargs})
    return None

