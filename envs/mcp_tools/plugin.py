"""The MCP plugin: registers ``lightning/MCP-v0`` and gives its AIR signals.

The MCP agent (:mod:`.agent`) emits, after each call, what its tool calls did; this plugin reads
that from the step's ``outcome`` (raw values; the env multiplies each by its ``air_weights`` entry
and drops those without one):

=========================  ===========================================================================
source                     raw value, on which step
=========================  ===========================================================================
``mcp.tool_ok``            tool calls of this step the server answered without an error
``mcp.tool_error``         tool calls of this step that failed: the tool reported an error
                           (``isError``), a tool the server does not list, arguments that are not a
                           JSON object
``mcp.answer_missing``     1.0 on the last step when the turns ran out before a final answer
=========================  ===========================================================================

::

    agentgym-lightning train --env lightning/MCP-v0 ... --air mcp.tool_error=-0.1 --air mcp.answer_missing=-0.2
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentgym_lightning.hookspecs import hookimpl
from agentgym_lightning.trajectory import Reward, Step, Trajectory

SOURCES: tuple[str, ...] = ("mcp.tool_ok", "mcp.tool_error", "mcp.answer_missing")


@hookimpl
def agentgym_register_envs() -> list[dict[str, Any]]:
    return [{"id": "lightning/MCP-v0", "entry_point": "agentgym_lightning.envs.mcp_tools.env:make_env"}]


@hookimpl
def agentgym_intermediate_rewards(step: Step, trajectory: Trajectory, weights: Mapping[str, float]) -> list[Reward]:
    if not any(source in weights for source in SOURCES):
        return []
    signals: dict[str, float] = {}
    records = step.outcome.get("mcp_tools")
    if isinstance(records, list) and records:
        failed = sum(1 for r in records if isinstance(r, Mapping) and not r.get("ok"))
        signals["mcp.tool_ok"] = float(len(records) - failed)
        signals["mcp.tool_error"] = float(failed)
    if step.outcome.get("answer_status") == "missing":
        signals["mcp.answer_missing"] = 1.0
    return [Reward(value=value, source=source) for source, value in signals.items() if source in weights and value]
