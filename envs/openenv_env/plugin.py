"""The OpenEnv plugin: registers ``lightning/OpenEnv-v0``, what ``--env openenv:URL`` makes (see
:data:`agentgym_lightning.registration.ENV_FORMATS`). A failing server needs no classification of
its own: :class:`.session.OpenEnvServerError` is a ``ConnectionError``, ``infra_failed`` by default."""

from __future__ import annotations

from typing import Any

from agentgym_lightning.hookspecs import hookimpl


@hookimpl
def agentgym_register_envs() -> list[dict[str, Any]]:
    return [{"id": "lightning/OpenEnv-v0", "entry_point": "agentgym_lightning.envs.openenv_env.env:make_env"}]
