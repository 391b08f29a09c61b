"""Registers the ``lightning/...`` environment ids with Gymnasium (on ``import agentgym_lightning``).

Gymnasium 1.x has no entry-point env plugins, so environments come through the
``agentgym_register_envs`` hook: the bundled env packages' own plugins (``envs/<name>/plugin.py``,
see :mod:`agentgym_lightning.plugin_manager`) and third-party ones alike. Only the core's own demo
env is named here.
"""

from __future__ import annotations

import gymnasium as gym
from gymnasium.envs.registration import WrapperSpec

#: The environments the core registers itself: id -> entry point (the env packages under
#: ``envs/`` register theirs through their plugins).
BUNDLED_ENVS: dict[str, str] = {
    "lightning/GuessNumber-v0": "agentgym_lightning.envs.guess_number:make_env",
}

#: Applied by ``gym.make`` after its ``TimeLimit``: ``max_episode_steps=N`` ends agent episodes
#: at step N with the trajectory in ``info`` (see :class:`agentgym_lightning.env.TimeLimitAsMaxTurns`).
TIME_LIMIT_AS_MAX_TURNS = WrapperSpec(
    name="TimeLimitAsMaxTurns", entry_point="agentgym_lightning.env:TimeLimitAsMaxTurns", kwargs={}
)

_done = False
#: Ids that plugins registered through ``agentgym_register_envs``.
_plugin_env_ids: set[str] = set()


def register_envs() -> None:
    """Register bundled and plugin environments once (idempotent)."""
    global _done
    if _done:
        return
    _done = True
    for env_id, entry_point in BUNDLED_ENVS.items():
        if env_id not in gym.registry:
            # Agents end themselves; the env enforces max_turns and time limits, so no TimeLimit
            # by default. One asked for (max_episode_steps=N) becomes max_turns=N.
            gym.register(
                id=env_id, entry_point=entry_point, disable_env_checker=False, additional_wrappers=(TIME_LIMIT_AS_MAX_TURNS,)
            )
    from agentgym_lightning.plugin_manager import get_plugin_manager

    for specs in get_plugin_manager().hook.agentgym_register_envs():
        for spec in specs or []:
            spec = dict(spec)
            _plugin_env_ids.add(spec["id"])
            spec.setdefault("additional_wrappers", (TIME_LIMIT_AS_MAX_TURNS,))
            if spec["id"] not in gym.registry:
                gym.register(**spec)


def lightning_env_ids() -> list[str]:
    """Every registered id in the ``lightning`` namespace and those added by plugins."""
    register_envs()
    return sorted(k for k, v in gym.registry.items() if v.namespace == "lightning" or k in _plugin_env_ids)
