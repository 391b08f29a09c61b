"""The verifiers plugin: registers ``lightning/Verifiers-v0`` (what ``--env verifiers:MODULE``
makes, see :data:`agentgym_lightning.registration.ENV_FORMATS`) and says that a verifiers
environment that failed (:class:`.errors.VerifiersRolloutError`: its rollout raised or stopped
with an error) is an infrastructure failure: the environment's fault, never the model's zero."""

from __future__ import annotations

from typing import Any

from agentgym_lightning.hookspecs import hookimpl
from agentgym_lightning.trajectory import Status

from .errors import VerifiersRolloutError


@hookimpl
def agentgym_register_envs() -> list[dict[str, Any]]:
    return [{"id": "lightning/Verifiers-v0", "entry_point": "agentgym_lightning.envs.verifiers_env.env:make_env"}]


@hookimpl
def agentgym_classify_error(error: BaseException) -> Status | None:
    return Status.INFRA_FAILED if isinstance(error, VerifiersRolloutError) else None
