"""The Spider plugin: registers ``lightning/Spider-v0`` and gives its AIR, what happened to the SQL
a call wrote, as reward signals.

After each writer/rewriter call the Spider agent emits ``sql_status`` (one of ``no_sql``,
``parse_error``, ``exec_error``, ``executes``; see ``agentgym_lightning.envs.spider.agent``), which
lands in that step's ``outcome``. This plugin turns it into one signal of raw value 1.0, named
``spider.<status>``. The env keeps only signals that ``air_weights`` names and multiplies them by
their weight, so AIR is off unless asked for and the plain reward stays comparable with published
numbers::

    gym.make("lightning/Spider-v0", air_weights={"spider.exec_error": -0.1, "spider.no_sql": -0.2})

Each weighted signal is logged as its own reward component (``Reward.source``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentgym_lightning.hookspecs import hookimpl
from agentgym_lightning.trajectory import Reward, Step, Trajectory

#: The signals, in order of how far the SQL got.
SOURCES: tuple[str, ...] = ("spider.no_sql", "spider.parse_error", "spider.exec_error", "spider.executes")



@hookimpl
def agentgym_register_envs() -> list[dict[str, Any]]:
    return [
        {"id": "lightning/Spider-v0", "entry_point": "agentgym_lightning.envs.spider.env:make_env"},
    ]


@hookimpl
def agentgym_intermediate_rewards(step: Step, trajectory: Trajectory, weights: Mapping[str, float]) -> list[Reward]:
    status = step.outcome.get("sql_status")
    if not isinstance(status, str):
        return []  # not a Spider step, or a checker call
    source = f"spider.{status}"
    if source not in weights or source not in SOURCES:
        return []
    return [Reward(value=1.0, source=source)]
