"""Examples of an agent's calls at a step of a run, as plain text: what a doc quotes to show what
moved in the agent's behaviour between an early and a late step (``agentgym-lightning calls RUN
--steps 1 40``). Any env: it reads only the run's episode files.

Which calls is a rule, not a choice, so that a quote is not picked for how it looks: the step's
episodes by GRPO group as the report lists them, one episode of each group in turn (different
tasks first), and of each episode its first call (its first call of ``agent`` when given: a
call's ``agent`` or ``role``). Each example holds the call's last user message (what the agent
asked), the policy's answer, what the agent emitted after it (its ``outcome``: what the env made of
the answer, e.g. the SQL it ran and whether it ran), the call's rewards (AIR) and its episode's
final reward.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from agentgym_lightning.trajectory import Step, Trajectory
from agentgym_lightning.viewer.pages import by_group, message_text, shorten
from agentgym_lightning.viewer.run import RunFolder

__all__ = ["CallExample", "call_examples", "format_examples"]


@dataclass(frozen=True)
class CallExample:
    """One call of one episode of a step (or an evaluation: ``kind == "eval"``)."""

    kind: str
    step: int
    episode_id: str
    #: The episode's task, short: its ``id`` when it has one.
    task: str
    #: The call's index in its episode, and the agent (or role) that made it.
    call: int
    agent: str | None
    #: The request's last user message (a raw-prompt call: the prompt's end), cut at the limit.
    asked: str
    #: The policy's answer: its text and tool calls (or the error it was answered with).
    answer: str
    #: What the agent emitted after the answer (:attr:`~agentgym_lightning.trajectory.Step.outcome`),
    #: as JSON cut at the limit; ``""`` when nothing.
    outcome: str
    #: The call's reward components, as ``(source, value)``.
    rewards: tuple[tuple[str, float], ...]
    episode_reward: float | None


def call_examples(
    run: RunFolder, step: int, *, count: int = 3, agent: str | None = None, kind: str = "train", limit: int = 400
) -> list[CallExample]:
    """Up to ``count`` calls of the episodes of ``step`` (``kind``: ``"train"`` or ``"eval"``),
    chosen by the module's rule; texts cut at ``limit`` characters. Raises ``KeyError`` when the
    run has no such episode file."""
    file = run.episode_file(kind, step)
    groups = list(by_group(run.episodes(file)).values())
    turns = max((len(g) for g in groups), default=0)
    examples: list[CallExample] = []
    for episode in (g[i] for i in range(turns) for g in groups if i < len(g)):
        found = next(((i, s) for i, s in enumerate(episode.steps) if agent is None or agent in (s.agent, s.role)), None)
        if found is not None:
            examples.append(_example(kind, step, episode, *found, limit))
        if len(examples) == count:
            break
    return examples


def _task(episode: Trajectory) -> str:
    task = episode.task
    if isinstance(task, dict) and isinstance(task.get("id"), (str, int)):
        return str(task["id"])
    return shorten(json.dumps(task, default=str), 80)


def _asked(step: Step, limit: int) -> str:
    users = [m for m in step.request.messages if m.get("role") == "user"]
    if users:
        return shorten(message_text(users[-1]), limit)
    prompt = step.request.prompt or ""
    return ("…" if len(prompt) > limit else "") + prompt[-limit:]


def _example(kind: str, step_number: int, episode: Trajectory, index: int, step: Step, limit: int) -> CallExample:
    c = step.completion
    if c is not None:
        answer = message_text({"content": c.text, "tool_calls": [tc.to_openai() for tc in c.tool_calls]})
    else:
        answer = f"(no completion: {step.error or 'none recorded'})"
    return CallExample(
        kind=kind,
        step=step_number,
        episode_id=episode.episode_id,
        task=_task(episode),
        call=index,
        agent=step.agent or step.role,
        asked=_asked(step, limit),
        answer=shorten(answer, limit),
        outcome=shorten(json.dumps(step.outcome, default=str, ensure_ascii=False), limit) if step.outcome else "",
        rewards=tuple((r.source, r.value) for r in step.rewards),
        episode_reward=episode.final_reward,
    )


def format_examples(examples: Sequence[CallExample]) -> str:
    """The examples as text, one block each: a header line, then what was asked, the answer and
    the outcome (when there is one), indented."""
    blocks = []
    for x in examples:
        what = "evaluation after step" if x.kind == "eval" else "step"
        rewards = ", ".join(f"{source} {value:+.3f}" for source, value in x.rewards) or "none"
        final = "–" if x.episode_reward is None else f"{x.episode_reward:.3f}"
        head = (
            f"{what} {x.step} · task {x.task} · episode {x.episode_id} · call {x.call}"
            f"{f' ({x.agent})' if x.agent else ''} · call rewards: {rewards} · episode reward {final}"
        )
        outcome = f"\n  outcome:\n{_indent(x.outcome)}" if x.outcome else ""
        blocks.append(f"{head}\n  asked:\n{_indent(x.asked)}\n  answer:\n{_indent(x.answer)}{outcome}")
    return "\n\n".join(blocks)


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in (text.splitlines() or [""]))
