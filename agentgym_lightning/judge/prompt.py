"""What the judge reads: a group's task and episodes as one prompt, cut to a token budget.

The judge sees the task (without its gold fields unless the config says so), and for each episode
its status and final answer (without the environment's own verdict on it, such as Arithmetic's
``"correct": false``, unless ``show_verdict``), and on request a compact transcript: each call's answer, its tool
calls, what the agent recorded after it (tool results, errors) and the agent's spans. Each
episode gets an equal share of the budget; an episode longer than its share loses the middle of
its transcript (its start and its final answer stay), and the judge is told how much was cut.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from agentgym_lightning.judge.config import GOLD_KEYS, VERDICT_KEYS, JudgeConfig
from agentgym_lightning.trajectory import Status, Trajectory

__all__ = ["GroupPrompt", "group_prompt", "approx_tokens", "SCORES_SCHEMA"]

#: Counts tokens of a text (the judge's tokenizer when known).
TokenCounter = Callable[[str], int]

#: The answer's JSON schema; ``n`` scores is checked when parsing (:mod:`.scores`).
SCORES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"scores": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1}}},
    "required": ["scores"],
    "additionalProperties": False,
}

_MODE_TEXT = {
    "relative": (
        "Compare the {n} episodes with each other and give each a score between 0 and 1: the better the "
        "episode, the higher its score. Spread the scores to show how much better one is than another."
    ),
    "absolute": "Score each of the {n} episodes on its own against the rubric, between 0 (worst) and 1 (best).",
}
_ANSWER_TEXT = (
    'Answer with one JSON object and nothing else: {{"scores": [s_1, ..., s_{n}]}}, one number per '
    "episode in the order shown."
)
# Characters kept per 4 tokens when no tokenizer is given: a rough English average.
_CHARS_PER_TOKEN = 4


def approx_tokens(text: str) -> int:
    """A tokenizer-free token estimate (4 characters a token): what the budget uses when the
    judge's tokenizer is unknown."""
    return math.ceil(len(text) / _CHARS_PER_TOKEN)


class GroupPrompt:
    """One judge call's messages, and what was cut to fit the budget."""

    def __init__(self, messages: list[dict[str, str]], cut_chars: int, tokens: int) -> None:
        self.messages = messages
        #: Characters of episode text left out to fit ``max_prompt_tokens``.
        self.cut_chars = cut_chars
        #: The prompt's size as counted for the budget.
        self.tokens = tokens

    def text(self) -> str:
        """The whole prompt as one string (the cache key is made from it)."""
        return "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in self.messages)


def group_prompt(
    task: Any, episodes: Sequence[Trajectory], config: JudgeConfig, count_tokens: TokenCounter = approx_tokens
) -> GroupPrompt:
    """The judge's messages for ``episodes`` (one group) on ``task``, within ``max_prompt_tokens``."""
    n = len(episodes)
    system = "\n\n".join([config.rubric.strip(), _MODE_TEXT[config.mode].format(n=n), _ANSWER_TEXT.format(n=n)])
    head = "## Task\n" + _task_text(task, config.show_gold)
    fixed = count_tokens(system) + count_tokens(head) + 64 * n  # headers and the cut notes
    share = max(16, (config.max_prompt_tokens - fixed) // max(n, 1))
    cut_total = 0
    parts = [head]
    for i, t in enumerate(episodes, 1):
        # the final answer keeps up to half the episode's share, the record of its calls the rest
        hidden = frozenset() if config.show_verdict else _verdict_keys(t)
        answer, cut_answer = _fit(_final_answer(t, hidden), share // 2, count_tokens)
        record, cut_record = _fit(_episode_record(t, config.transcript, hidden), share - count_tokens(answer), count_tokens)
        cut = cut_answer + cut_record
        cut_total += cut
        note = f"\n[{cut} characters of this episode were cut from the middle to fit the judge's budget]" if cut else ""
        parts.append(f"## Episode {i}\n{record}\nFinal answer: {answer}{note}")
    user = "\n\n".join(parts)
    if cut_total:
        user += f"\n\n(Note: {cut_total} characters of the episodes were cut to fit; judge what is shown.)"
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return GroupPrompt(messages, cut_total, count_tokens(system) + count_tokens(user))


def _task_text(task: Any, show_gold: bool) -> str:
    if isinstance(task, dict):
        shown = {k: v for k, v in task.items() if show_gold or k not in GOLD_KEYS}
        # file paths and ids tell the judge nothing about quality
        shown = {k: v for k, v in shown.items() if not (k.endswith("_path") or k in ("id", "split"))}
        if len(shown) == 1:
            return str(next(iter(shown.values())))
        return json.dumps(shown, ensure_ascii=False, default=str, indent=1)
    return str(task)


def _verdict_keys(t: Trajectory) -> frozenset[str]:
    """The keys that hold the env's verdict on ``t``: :data:`VERDICT_KEYS` and the names of its
    ``metrics`` variable (RAG's ``f1``, Spider's ``official``: what the verifier measured)."""
    metrics = t.variables.get("metrics") if isinstance(t.variables, dict) else None
    measured = frozenset(str(k) for k in metrics) if isinstance(metrics, dict) else frozenset()
    return frozenset(VERDICT_KEYS) | measured


def _final_answer(t: Trajectory, hidden: frozenset[str] = frozenset()) -> str:
    if t.result is not None:
        result = t.result
        if isinstance(result, dict) and hidden:
            result = {k: v for k, v in result.items() if str(k) not in hidden}
        return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)
    for step in reversed(t.steps):
        if step.completion is not None and step.completion.text.strip():
            return step.completion.text
    return "(no answer)"


def _episode_record(t: Trajectory, transcript: bool, hidden: frozenset[str] = frozenset()) -> str:
    status = {Status.SUCCEEDED: "finished", Status.TASK_FAILED: "failed", Status.TRUNCATED: "cut off (turn or time limit)"}.get(
        t.status, t.status.value
    )
    lines = [f"Status: {status}" + (f" ({t.error})" if t.error and t.status is not Status.SUCCEEDED else "")]
    if transcript:
        for step in t.steps:
            who = f" by {step.agent or step.role}" if (step.agent or step.role) else ""
            lines.append(f"- call {step.index + 1}{who}:")
            if step.completion is not None:
                if step.completion.text.strip():
                    lines.append(f"  answered: {step.completion.text.strip()}")
                for call in step.completion.tool_calls:
                    lines.append(f"  tool call: {call.name}({call.arguments})")
            if step.error:
                lines.append(f"  error: {step.error}")
            for key, value in step.outcome.items():
                if key in hidden:
                    continue
                lines.append(f"  then {key}: {value if isinstance(value, str) else json.dumps(value, default=str)}")
        for span in t.spans:
            failed = " (failed)" if span.get("status") == "error" or span.get("error") else ""
            lines.append(f"- span {span.get('name', '?')}{failed}")
    return "\n".join(lines)


def _fit(text: str, budget: int, count_tokens: TokenCounter) -> tuple[str, int]:
    """``text`` within ``budget`` tokens, its middle cut (the start and the final answer stay)."""
    if count_tokens(text) <= budget:
        return text, 0
    lo, hi = 0, len(text)
    # the most characters whose head + tail fits: binary search on the kept length
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count_tokens(_ends(text, mid)) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return _ends(text, lo), len(text) - lo


def _ends(text: str, keep: int) -> str:
    head = keep // 3
    tail = keep - head
    return text[:head] + " [...] " + (text[len(text) - tail :] if tail else "")
