"""Selective training: which LLM calls of an episode a trainer may learn from (the paper's ``agent_match``).

An episode may hold several agents or roles: a LangGraph graph's nodes, an Agents SDK run's
agents, the writer/checker/rewriter of a SQL agent. Every step records who made the call:

- ``step.agent``: the framework's own name for it (the LangGraph node, the Agents SDK agent's
  ``name``, the AutoGen agent's ``name``), sent by the framework adapters as the request's
  ``metadata["agent"]`` (any agent may send it);
- ``step.role``: ``metadata["role"]``, the part of the agent it says it is;
- ``step.variables``: the semantic variables the agent had emitted when it made the call.

An :class:`AgentMatch` decides from those whether a call is trainable. A call it rejects is
still answered and recorded (``step.trainable = False``): the agent runs exactly as it would,
only the trainer leaves the call's tokens out. A call the agent itself marked
``metadata={"trainable": "false"}`` stays untrainable whatever the match says.

    env = gym.make("lightning/Spider-v0", agent="langgraph", agent_match="writer|rewriter")
    env = AgentEnv(agent, tasks, reward, agent_match={"role": "solver", "variables": {"phase": "final"}})
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentgym_lightning.trajectory import Step

__all__ = ["AgentMatch", "AgentMatchSpec", "as_agent_match"]

#: What ``agent_match`` accepts: a regular expression (matched in full against the call's agent
#: name or its role), a mapping of :class:`AgentMatch` fields, an :class:`AgentMatch`, or any
#: ``fn(step) -> bool``.
AgentMatchSpec = str | Mapping[str, Any] | Callable[["Step"], bool]


@dataclass(frozen=True)
class AgentMatch:
    """A filter over an episode's calls; every condition given must hold.

    Args:
        agent: Regular expression the call's agent name must match in full (``"writer|rewriter"``).
            A call that names no agent does not match.
        role: Regular expression the call's role must match in full.
        name: Regular expression that either the agent name or the role must match in full: what
            a bare string ``agent_match="writer|rewriter"`` means, so it works whether the agent
            names its parts as framework agents (LangGraph nodes) or as roles (metadata).
        variables: Semantic variables the call must have been made with: ``{"phase": "answer"}``
            requires ``step.variables["phase"] == "answer"``.
    """

    agent: str | None = None
    role: str | None = None
    name: str | None = None
    variables: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for label in ("agent", "role", "name"):
            pattern = getattr(self, label)
            if pattern is None:
                continue
            if not isinstance(pattern, str):
                raise TypeError(f"agent_match {label!r} must be a regular expression string, got {pattern!r}")
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"agent_match {label!r} is not a valid regular expression ({exc}): {pattern!r}") from None
        if not isinstance(self.variables, Mapping):
            raise TypeError(f"agent_match 'variables' must be a mapping of name -> value, got {self.variables!r}")
        if self.agent is None and self.role is None and self.name is None and not self.variables:
            raise ValueError("an AgentMatch needs at least one of agent, role, name or variables")

    def __call__(self, step: Step) -> bool:
        if self.agent is not None and not _full(self.agent, step.agent):
            return False
        if self.role is not None and not _full(self.role, step.role):
            return False
        if self.name is not None and not (_full(self.name, step.agent) or _full(self.name, step.role)):
            return False
        return all(key in step.variables and step.variables[key] == value for key, value in self.variables.items())


def _full(pattern: str, value: str | None) -> bool:
    return value is not None and re.fullmatch(pattern, value) is not None


def as_agent_match(spec: AgentMatchSpec | AgentMatch | None) -> Callable[[Step], bool] | None:
    """Turn what a user passed as ``agent_match`` into ``fn(step) -> bool`` (``None``: train every call)."""
    if spec is None or isinstance(spec, AgentMatch):
        return spec
    if isinstance(spec, str):
        return AgentMatch(name=spec)
    if isinstance(spec, Mapping):
        unknown = set(spec) - {"agent", "role", "name", "variables"}
        if unknown:
            raise ValueError(
                f"agent_match has unknown keys {sorted(unknown)}; use agent, role, name and/or variables"
            )
        return AgentMatch(**dict(spec))
    if callable(spec):
        return spec
    raise TypeError(
        f"agent_match must be a regular expression, a mapping (agent/role/name/variables), an AgentMatch "
        f"or fn(step) -> bool, not {type(spec).__name__}"
    )
