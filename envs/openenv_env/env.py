"""``--env openenv:URL`` or ``openenv:MODULE``: an OpenEnv environment server, played by a chat
agent, as an ``AgentEnv``.

    agentgym-lightning train --env openenv:http://127.0.0.1:8000 --env-kwarg max_turns=8
    agentgym-lightning train --env openenv:my_env.server.app     # its app, served in this process
    env = gym.make("lightning/OpenEnv-v0", server="http://127.0.0.1:8000")

Each episode opens its own session with the server (its own environment instance there) and is
played by :class:`.agent.OpenEnvChatAgent`, or by ``agent=module:Class`` (a subclass of it, or
any class taking the same arguments). Tasks are reset seeds, ``first_seed`` to ``first_seed +
num_tasks - 1`` (held out: ``--eval-env-kwarg first_seed=100000``); the final reward is the sum of
the env's rewards. A server that is down or fails ends its episode ``infra_failed``, naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentgym_lightning.env import AgentEnv
from agentgym_lightning.envs.callables import load_callable

from .agent import OpenEnvChatAgent
from .local_server import serve_module

__all__ = ["OPENENV_ID", "episode_return", "make_env"]

OPENENV_ID = "lightning/OpenEnv-v0"


def episode_return(task: Mapping[str, Any], result: Mapping[str, Any]) -> float:
    """The episode's final reward: the sum of the env's rewards."""
    return float(result["return"])


def make_env(
    server: str,
    agent: str | None = None,
    num_tasks: int = 64,
    first_seed: int = 0,
    max_turns: int = 16,
    max_tokens: int | None = None,
    timeout: float = 60.0,
    **kwargs: Any,
) -> AgentEnv:
    """The env of the OpenEnv server at ``server`` (its base URL, or the module of its app:
    :mod:`.local_server`): ``num_tasks`` seeds from
    ``first_seed``, played by ``agent`` (``module:Class``; default :class:`OpenEnvChatAgent`) in
    at most ``max_turns`` model calls of ``max_tokens``, each server request within ``timeout``
    seconds; other keyword arguments go to :class:`~agentgym_lightning.env.AgentEnv`."""
    if num_tasks < 1:
        raise ValueError(f"num_tasks must be at least 1, got {num_tasks}")
    agent_class = OpenEnvChatAgent if agent is None else load_callable(agent, "agent=", "an agent class like OpenEnvChatAgent")
    url = str(server) if str(server).startswith(("http://", "https://")) else serve_module(str(server), timeout)
    player = agent_class(url, max_turns=int(max_turns), max_tokens=max_tokens, timeout=float(timeout))
    kwargs.setdefault("env_id", f"openenv:{server}")
    tasks = [{"seed": first_seed + i} for i in range(num_tasks)]
    return AgentEnv(player, tasks, episode_return, **kwargs)
