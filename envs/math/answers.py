"""Final answers: find one in a model's reply, read it as a number, and compare it with the gold.

**Finding** (:func:`extract_answer`). The answer is what follows the last answer marker of the
reply — ``Answer:``, ``The answer is``, ``####`` or ``\\boxed{...}`` — up to the end of its line.
Without a marker, the last number in the reply is taken (unless ``require_marker``). The status
says which: ``ok`` (a marker and something after it, or a number), ``unparsable`` (a marker with
nothing readable after it), ``missing`` (no marker and no number, or no reply).

**Reading** (:func:`parse_answer`). Dollar/euro/pound signs, ``\\boxed{}``, ``**bold**``, a
trailing period and a trailing unit (``18 eggs``) are dropped; ``1,000`` is 1000; ``3/4``,
``0.75``, ``\\frac{3}{4}`` and simple expressions (``2*9``) are read with the safe calculator
(:mod:`.calculator`), exactly: ``0.1`` is the rational 1/10. When the text holds ``=``, the
right-most side counts (``12*7 = 84``, ``3/4 = 0.75``; Calc-X writes ``2/3 = around 0.67``).
A single letter A–E, alone or as ``(C)``/``C)``, is a multiple-choice option (Calc-X's AQuA items).

**Comparing** (:func:`answers_match`). Rational values compare exactly when ``rel_tol`` is 0
(GSM8K's default); otherwise ``|a - b| <= rel_tol * max(|a|, |b|)`` (Calc-X used 1e-2). Values
that are not rational (``sqrt(2)``) are computed to 30 significant digits and compare within a
relative 1e-20 at ``rel_tol`` 0. A **percentage** matches in both readings: ``25%`` matches ``25``
and ``0.25`` (and a gold ``25%`` matches ``25`` or ``0.25``), because questions that ask "what
percent" are answered both ways. Options compare as letters, case-insensitively.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sympy

from .calculator import CalculatorError, CalculatorLimits, evaluate

__all__ = [
    "ANSWER_STATUSES",
    "Answer",
    "ExtractedAnswer",
    "parse_answer",
    "extract_answer",
    "answers_match",
    "gsm8k_gold",
]

#: The statuses :func:`extract_answer` reports.
ANSWER_STATUSES: tuple[str, ...] = ("ok", "unparsable", "missing")

# Answers are short: a tighter length limit than tool calls get.
_ANSWER_LIMITS = CalculatorLimits(max_chars=200)
#: Relative tolerance for values that are not rational, when ``rel_tol`` is 0.
NUMERIC_EPSILON = 1e-20


@dataclass(frozen=True)
class Answer:
    """A parsed answer: a number (``value``, exact when rational) or an option letter."""

    value: sympy.Rational | sympy.Float | None = None
    option: str | None = None
    #: Written with a ``%``: ``value`` is the number before it (25 for ``25%``).
    percent: bool = False

    def readings(self) -> list[sympy.Expr]:
        """The numbers this answer may mean: ``25%`` is 25 or 1/4."""
        if self.value is None:
            return []
        return [self.value, self.value / 100] if self.percent else [self.value]


@dataclass(frozen=True)
class ExtractedAnswer:
    """What :func:`extract_answer` found: the answer text (``None`` if missing) and a status."""

    text: str | None
    status: str
    #: Whether it came after an explicit marker (else: the reply's last number).
    marked: bool = False


_BOXED = re.compile(r"\\boxed\s*\{((?:[^{}]|\{[^{}]*\})*)\}")
_FRAC = re.compile(r"\\d?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_CURRENCY = re.compile(r"[$€£¥]|\\\$|\bUSD\b|\bdollars?\b|\bcents?\b", re.IGNORECASE)
_OPTION = re.compile(r"\(?\s*([A-Ea-e])\s*\)?(?:[\s.:)].*)?\Z", re.DOTALL)
_LEADING_NUMBER = re.compile(r"-?\s*(?:\d[\d,]*(?:\.\d+)?|\.\d+)(?:\s*/\s*\d+(?:\.\d+)?)?\s*%?")
# A number as it appears in prose: sign, thousands separators, decimals, a fraction, a percent.
_NUMBER_IN_TEXT = re.compile(r"-?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?%?|-?\$?\.\d+%?")
# "2/3 = around 0.67" (Calc-X), "1/3 ≈ 0.333" (our calculator): the exact value is on the left.
_APPROX = re.compile(r"\s*(?:≈|~|=\s*(?:about|around|approximately|roughly)\b)\s*", re.IGNORECASE)
_MARKER = re.compile(r"(?:\banswer\s*(?:is|:)|####|\\boxed\s*\{)", re.IGNORECASE)


def _split_approx(text: str) -> tuple[str, str]:
    """``(exact part, approximation)`` of ``"2/3 = around 0.67"``; ``(text, "")`` without one."""
    parts = _APPROX.split(text, maxsplit=1)
    return (parts[0], parts[1]) if len(parts) == 2 else (text, "")


def _clean(text: str) -> str:
    text = text.strip()
    boxed = _BOXED.search(text)
    if boxed:
        text = boxed.group(1)
    text = _FRAC.sub(r"(\1)/(\2)", text)
    text = text.replace("\\left", "").replace("\\right", "").replace("\\cdot", "*").replace("\\times", "*")
    text = text.replace("\\%", "%").strip().strip("*")  # **18** (markdown bold)
    text = _CURRENCY.sub("", text)
    exact, approx = _split_approx(text)
    text = exact if exact.strip() else approx
    if "=" in text:
        text = text.rsplit("=", 1)[1]
    text = re.sub(r"^\s*(?:about|around|approximately|roughly)\s+", "", text, flags=re.IGNORECASE)
    return text.strip().rstrip(".,;:!").strip()


def parse_answer(text: str | None) -> Answer | None:
    """Read an answer (see the module docstring); ``None`` when it is not a number or an option."""
    if text is None:
        return None
    if not isinstance(text, str):
        text = str(text)
    if len(text) > 10_000:
        return None
    raw = text.strip()
    option = _OPTION.fullmatch(raw)
    if option and (len(raw) <= 3 or raw[1:2] in (")", ".", ":") or raw.startswith("(")):
        return Answer(option=option.group(1).upper())
    cleaned = _clean(raw)
    if not cleaned:
        return None
    percent = cleaned.endswith("%")
    body = cleaned[:-1].strip() if percent else cleaned
    value = _number(body)
    if value is None:
        lead = _LEADING_NUMBER.match(cleaned)  # "18 eggs", "5 hours and 3 minutes" -> the first number
        if lead is None or not cleaned[lead.end() :].strip()[:1].isalpha():
            return None
        lead_text = lead.group().strip()
        percent = lead_text.endswith("%")
        value = _number(lead_text.rstrip("%").strip())
        if value is None:
            return None
    return Answer(value=value, percent=percent)


def _number(text: str) -> sympy.Rational | sympy.Float | None:
    if not text or "%" in text:
        return None
    try:
        return evaluate(text, _ANSWER_LIMITS)
    except CalculatorError:
        return None


def extract_answer(reply: str | None, *, require_marker: bool = False) -> ExtractedAnswer:
    """Find the final answer in a model's reply (see the module docstring)."""
    if not reply or not reply.strip():
        return ExtractedAnswer(None, "missing")
    reply = reply[-20_000:]  # the end of a runaway reply is where an answer would be
    markers = list(_MARKER.finditer(reply))
    if markers:
        last = markers[-1]
        if last.group().startswith("\\boxed"):
            box = _BOXED.search(reply, last.start())
            after = box.group(1) if box else reply[last.end() :]
        else:
            after = reply[last.end() :]
        line = next((ln.strip() for ln in after.splitlines() if ln.strip()), "")
        if parse_answer(line) is not None:
            return ExtractedAnswer(line, "ok", marked=True)
        numbers = _NUMBER_IN_TEXT.findall(line)
        if numbers:  # "Answer: she makes 18 dollars a day" -> 18
            return ExtractedAnswer(numbers[0].strip(), "ok", marked=True)
        return ExtractedAnswer(line or None, "unparsable", marked=True)
    if require_marker:
        return ExtractedAnswer(None, "missing")
    numbers = _NUMBER_IN_TEXT.findall(reply)
    if not numbers:
        return ExtractedAnswer(None, "missing")
    return ExtractedAnswer(numbers[-1].strip(), "ok")


def _close(a: sympy.Expr, b: sympy.Expr, rel_tol: float) -> bool:
    if isinstance(a, sympy.Rational) and isinstance(b, sympy.Rational) and rel_tol == 0:
        return a == b
    tol = rel_tol if rel_tol > 0 else NUMERIC_EPSILON
    diff = abs(sympy.Float(a, 30) - sympy.Float(b, 30))
    return bool(diff <= tol * max(abs(sympy.Float(a, 30)), abs(sympy.Float(b, 30)))) or bool(diff == 0)


def answers_match(predicted: str | Answer | None, gold: str | Answer, rel_tol: float = 0.0) -> bool:
    """Whether ``predicted`` is the same answer as ``gold`` (see the module docstring).

    Raises ``ValueError`` when ``gold`` itself cannot be read (a data problem, not the model's).
    """
    if rel_tol < 0:
        raise ValueError(f"rel_tol must be >= 0, got {rel_tol}")
    gold_answer = gold if isinstance(gold, Answer) else parse_answer(gold)
    if gold_answer is None:
        raise ValueError(f"the gold answer {gold!r} is not a number or an option letter")
    pred = predicted if isinstance(predicted, Answer) or predicted is None else parse_answer(predicted)
    if pred is None:
        return False
    if gold_answer.option is not None or pred.option is not None:
        return gold_answer.option is not None and pred.option == gold_answer.option
    return any(_close(p, g, rel_tol) for p in pred.readings() for g in gold_answer.readings())


def gsm8k_gold(solution: str) -> str:
    """The final answer of a GSM8K solution: the text after its last ``####``."""
    if "####" not in solution:
        raise ValueError(f"a GSM8K answer must end with '#### <number>', got {solution[-80:]!r}")
    return solution.rsplit("####", 1)[1].strip()
