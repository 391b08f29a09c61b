"""AIR signal ``tool_call.malformed``: the model wrote a tool call the policy could not parse.

Backends that parse tool calls from text record why a call failed on
``Completion.tool_call_errors``; the call stays in the text, and the agent sees it as such.
"""

from __future__ import annotations

from collections.abc import Mapping

from agentgym_lightning.hookspecs import hookimpl
from agentgym_lightning.trajectory import Reward, Step, Trajectory

SOURCE = "tool_call.malformed"


@hookimpl
def agentgym_intermediate_rewards(step: Step, trajectory: Trajectory, weights: Mapping[str, float]) -> Reward | None:
    if SOURCE not in weights or step.completion is None:
        return None
    return Reward(value=float(len(step.completion.tool_call_errors) > 0), source=SOURCE)
