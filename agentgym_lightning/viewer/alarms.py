"""Collapse alarms: signs that a run is going wrong, read from its metrics and latest episodes.

Each check returns an :class:`Alarm` that is either raised (``firing``) or says the check passed,
with the numbers it looked at, so a reader sees what was checked and not only what fired:

* **diversity** — per GRPO group of the latest training step, the distinct completions (all of an
  episode's answers together) and distinct tool-call sequences among its episodes (the calls of
  the API's ``tool_calls`` or written as ``<tool_call>`` text: :func:`tool_calls_of`); fires when
  more than half of the groups have a single distinct answer (the policy stopped exploring);
* **entropy** — the mean token entropy of the last quarter of the steps against the first
  quarter; fires when it fell below half (collapse towards a deterministic policy);
* **train up, held-out down** — the training reward rose from the first to the last step while
  the held-out reward fell from the first to the last evaluation (over-fitting, reward hacking);
* **zero variance** — the share of groups in which every episode got the same value (no learning
  signal: ``samples/groups/zero_variance`` / ``samples/groups``) over the last quarter; fires
  above one half;
* **infra failures** — episodes that ended ``infra_failed`` (never trained on, but each one is a
  lost episode and often a broken backend); fires on any.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agentgym_lightning.llm import ToolCall
from agentgym_lightning.policies.tool_calls import TOOL_CALL_OPEN, parse_tool_calls
from agentgym_lightning.trajectory import Step, Trajectory

__all__ = ["Alarm", "GroupDiversity", "group_diversity", "run_alarms", "tool_calls_of"]


@dataclass(frozen=True)
class Alarm:
    name: str
    firing: bool
    text: str


@dataclass(frozen=True)
class GroupDiversity:
    """How different the episodes of one GRPO group are."""

    group: str
    episodes: int
    distinct_completions: int
    distinct_tool_sequences: int
    #: Tool calls made in the group, all episodes together.
    tool_calls: int = 0


def tool_calls_of(step: Step) -> list[ToolCall]:
    """The tool calls of a call's answer: those the API returned, or, for an agent on the text
    protocol (no ``tools`` in its request), the ``<tool_call>`` blocks its text holds."""
    c = step.completion
    if c is None:
        return []
    if c.tool_calls:
        return list(c.tool_calls)
    if TOOL_CALL_OPEN not in (c.text or ""):
        return []
    return parse_tool_calls(c.text, make_id=lambda: "").tool_calls


def _answers(t: Trajectory) -> str:
    return "\x00".join(s.completion.text for s in t.steps if s.completion is not None)


def _tool_sequence(t: Trajectory) -> str:
    return json.dumps([[tc.name, tc.arguments] for s in t.steps for tc in tool_calls_of(s)], default=str)


def group_diversity(episodes: Sequence[Trajectory]) -> list[GroupDiversity]:
    """The diversity of each group (an episode without a group is a group of one)."""
    groups: dict[str, list[Trajectory]] = {}
    for t in episodes:
        groups.setdefault(t.group_id or t.episode_id, []).append(t)
    return [
        GroupDiversity(
            key, len(ts), len({_answers(t) for t in ts}), len({_tool_sequence(t) for t in ts}),
            sum(len(tool_calls_of(s)) for t in ts for s in t.steps),
        )
        for key, ts in groups.items()
    ]


def _quarter_means(points: Sequence[tuple[int, float]]) -> tuple[float, float] | None:
    if len(points) < 2:
        return None
    k = max(1, len(points) // 4)
    first = [v for _, v in points[:k]]
    last = [v for _, v in points[-k:]]
    return sum(first) / len(first), sum(last) / len(last)


def run_alarms(series: Mapping[str, Sequence[tuple[int, float]]], latest: Sequence[Trajectory]) -> list[Alarm]:
    """Every check of the module docstring on one run (``latest``: its last training step's episodes)."""
    alarms = []
    diversity = [g for g in group_diversity(latest) if g.episodes > 1]
    if diversity:
        collapsed = sum(1 for g in diversity if g.distinct_completions == 1)
        completions = sum(g.distinct_completions for g in diversity) / len(diversity)
        calling = [g for g in diversity if g.tool_calls]
        tools = sum(g.distinct_tool_sequences for g in calling) / len(calling) if calling else 0.0
        size = sum(g.episodes for g in diversity) / len(diversity)
        tool_text = f" and {tools:.1f} distinct tool-call sequences (in the {len(calling)} groups that called tools)" if calling else ""
        alarms.append(Alarm(
            "diversity", collapsed > len(diversity) / 2,
            f"latest step: {collapsed} of {len(diversity)} groups answered identically; per group of {size:.0f}, "
            f"{completions:.1f} distinct completions{tool_text} on average",
        ))
    entropy = _quarter_means(series.get("entropy", []))
    if entropy:
        first, last = entropy
        alarms.append(Alarm("entropy", first > 0 and last < first / 2, f"token entropy {first:.3f} (first quarter) -> {last:.3f} (last quarter)"))
    train, held_out = series.get("train/reward/mean", []), series.get("eval/reward/mean", [])
    if len(train) >= 2 and len(held_out) >= 2:
        rising = train[-1][1] > train[0][1]
        falling = held_out[-1][1] < held_out[0][1]
        alarms.append(Alarm(
            "train up, held-out down", rising and falling,
            f"train reward {train[0][1]:.3f} -> {train[-1][1]:.3f}, held-out {held_out[0][1]:.3f} -> {held_out[-1][1]:.3f}",
        ))
    groups, flat = dict(series.get("samples/groups", [])), dict(series.get("samples/groups/zero_variance", []))
    if groups:
        steps = sorted(groups)[-max(1, len(groups) // 4):]
        total = sum(groups[s] for s in steps)
        share = sum(flat.get(s, 0.0) for s in steps) / total if total else 0.0
        alarms.append(Alarm("zero variance", share > 0.5, f"{share:.0%} of groups had no reward variance over the last {len(steps)} step(s)"))
    infra = sum(v for name in ("train/status/infra_failed", "eval/status/infra_failed") for _, v in series.get(name, []))
    episodes = sum(v for name in ("train/episodes", "eval/episodes") for _, v in series.get(name, []))
    if episodes:
        alarms.append(Alarm("infra failures", infra > 0, f"{infra:.0f} of {episodes:.0f} episodes ended infra_failed"))
    return alarms
