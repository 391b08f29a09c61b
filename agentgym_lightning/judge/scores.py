"""Reading the judge's answer, strictly: ``{"scores": [s_1, ..., s_n]}`` and nothing else.

A judge that answers anything else — prose, the wrong number of scores, a score outside [0, 1],
NaN — has not judged: :class:`JudgeAnswerError` says what was wrong, and the call is retried.
The only leniency is a single Markdown code fence around the object (```` ```json ... ``` ````),
which chat models add even when told not to; the object inside is held to the same rules.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

__all__ = ["JudgeAnswerError", "parse_scores", "scores_from_reply", "check_scores"]

_FENCE = re.compile(r"\A```(?:json)?\s*\n?(.*?)\n?```\Z", re.DOTALL)
# A judge's answer is a short object; anything longer is not one (and never reaches json.loads).
_MAX_ANSWER_CHARS = 100_000


class JudgeAnswerError(ValueError):
    """The judge's answer is not ``{"scores": [...]}`` with one score in [0, 1] per episode."""


def parse_scores(text: str, n: int) -> list[float]:
    """The ``n`` scores in ``text``, or :class:`JudgeAnswerError` saying what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise JudgeAnswerError("the judge's answer is empty")
    if len(text) > _MAX_ANSWER_CHARS:
        raise JudgeAnswerError(f"the judge's answer is {len(text)} characters, not a scores object")
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1).strip()
    try:
        data = json.loads(body, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise JudgeAnswerError(f"the judge's answer is not a JSON object ({exc}): {text[:120]!r}") from None
    return _checked(data, n)


def scores_from_reply(reply: Any, n: int, answer_format: str) -> list[float]:
    """The scores in an OpenAI ``ChatCompletion`` (the ``openai`` package's object), read from
    where ``answer_format`` asked the judge to put them."""
    if not getattr(reply, "choices", None):
        raise JudgeAnswerError("the judge's reply has no choices")
    message = reply.choices[0].message
    if answer_format == "tool":
        calls = message.tool_calls or []
        if len(calls) != 1 or calls[0].function.name != "submit_scores":
            names = [c.function.name for c in calls]
            raise JudgeAnswerError(f"the judge was asked for one submit_scores tool call, made {names or 'none'}")
        return parse_scores(calls[0].function.arguments, n)
    return parse_scores(message.content or "", n)


def check_scores(scores: Any, n: int) -> list[float]:
    """``scores`` held to what a fresh answer is: ``n`` finite numbers between 0 and 1 (scores read
    back from a cache file, which anyone may have edited). Raises :class:`JudgeAnswerError`."""
    return _checked({"scores": scores}, n)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a score")


def _checked(data: Any, n: int) -> list[float]:
    if not isinstance(data, dict) or set(data) != {"scores"}:
        keys = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise JudgeAnswerError(f'the judge\'s answer must be an object with exactly the key "scores"; got {keys}')
    scores = data["scores"]
    if not isinstance(scores, list):
        raise JudgeAnswerError(f'"scores" must be a list; got {type(scores).__name__}')
    if len(scores) != n:
        raise JudgeAnswerError(f"the judge gave {len(scores)} scores for {n} episodes")
    out = []
    for i, s in enumerate(scores, 1):
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or not 0.0 <= s <= 1.0:
            raise JudgeAnswerError(f"score {i} is {s!r}: each score must be a number between 0 and 1")
        out.append(float(s))
    return out
