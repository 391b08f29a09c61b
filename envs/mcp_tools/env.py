"""``lightning/MCP-v0``: an agent whose tools are an MCP server's, on tasks from a JSONL file.

    agentgym-lightning train --env lightning/MCP-v0 \\
        --env-kwarg "server=python my_server.py" --env-kwarg tasks=train.jsonl \\
        --env-kwarg verifier=my_checks:exact_answer --eval-env-kwarg tasks=held_out.jsonl

    env = gym.make("lightning/MCP-v0", server="http://127.0.0.1:8000/mcp", tasks="train.jsonl",
                   verifier="my_checks:exact_answer")

The agent (:mod:`.agent`) lists the server's tools through the ``mcp`` SDK (:mod:`.server`) and
hands them to the model as OpenAI tools; each tool call goes to the server. The episode's reward
is the user's verifier (:mod:`.verifier`: ``verifier(task, answer) -> float``) or, with none,
the LLM judge's (``train --judge-base-url ... --judge-model ...``, ``docs/judge.md``). A server
that fails (cannot start, dies, hangs, answers garbage) ends only its episode, ``infra_failed``,
naming the server. AIR sources: ``envs/mcp_tools/plugin.py``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from agentgym_lightning.env import AgentEnv

from .agent import DEFAULT_SYSTEM_PROMPT, MCPAgentConfig, MCPToolAgent
from .server import MCPServer
from .tasks import load_tasks
from .verifier import Verifier, load_verifier

__all__ = ["MCP_ID", "NoVerifierWarning", "VerifierReward", "make_env"]

MCP_ID = "lightning/MCP-v0"


class NoVerifierWarning(UserWarning):
    """``lightning/MCP-v0`` was built without a verifier: its rewards must come from the judge."""


class VerifierReward:
    """The episode's reward: ``verifier(task, answer)`` on the agent's final answer."""

    def __init__(self, verifier: Verifier) -> None:
        self.verifier = verifier

    def __call__(self, task: Mapping[str, Any], answer: str | None) -> float:
        return float(self.verifier(dict(task), answer))


def make_env(
    server: str,
    tasks: str,
    verifier: str | None = None,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    max_turns: int = 8,
    max_tokens: int | None = None,
    tool_timeout: float = 30.0,
    **kwargs: Any,
) -> AgentEnv:
    """The env: ``server`` (a stdio command or a streamable HTTP URL), ``tasks`` (a JSONL file),
    ``verifier`` (``module:function`` or ``file.py:function``; ``None``: the judge's reward),
    the agent's ``system_prompt``, ``max_turns`` model calls, ``max_tokens`` per call and
    ``tool_timeout`` seconds per tool call; other keyword arguments go to
    :class:`~agentgym_lightning.env.AgentEnv` (``air_weights``, ``time_limit``...). Nothing is
    started here: each episode opens its own session with the server."""
    if tool_timeout <= 0:
        raise ValueError(f"tool_timeout must be > 0 seconds, got {tool_timeout}")
    config = MCPAgentConfig(MCPServer.parse(str(server)), system_prompt, int(max_turns), max_tokens, float(tool_timeout))
    loaded = load_tasks(tasks)
    kwargs.setdefault("env_id", MCP_ID)
    kwargs.setdefault("max_turns", config.max_turns)
    if verifier is None:
        warnings.warn(
            f"{MCP_ID} has no verifier: its episodes end with no reward of their own. Give one "
            "(--env-kwarg verifier=module:function, a function (task, answer) -> float) or let the LLM judge "
            "score them (train --judge-base-url URL --judge-model NAME; docs/judge.md)",
            NoVerifierWarning,
            stacklevel=2,
        )
        # No reward_fn: the env would warn again, in words about Python; the judge fills it in.
        kwargs.setdefault("trajectory_reward", lambda trajectory: None)
        return AgentEnv(MCPToolAgent(config), loaded, **kwargs)
    return AgentEnv(MCPToolAgent(config), loaded, VerifierReward(load_verifier(verifier)), **kwargs)
