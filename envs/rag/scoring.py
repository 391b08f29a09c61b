"""Answer scoring: exact match and token F1 with the SQuAD normalisation, best over aliases.

This is the metric of SQuAD v1.1's official ``evaluate-v1.1.py``, which MuSiQue's and HotpotQA's
official evaluators reuse: lower-case, drop punctuation, drop the articles *a*, *an*, *the*,
collapse white space; F1 is the harmonic mean of token precision and recall (tokens counted as a
multiset); a prediction scores its best against every accepted answer (the answer and its
aliases). Two empty strings match; an empty prediction against a non-empty answer scores 0.

HotpotQA's own script also zeroes F1 when exactly one side is ``yes``/``no``/``noanswer`` and
they differ; plain SQuAD F1 already scores those pairs 0 unless the prediction adds words
(``"yes it is"`` vs ``"yes"``: 0.5 here, 0 there). We keep the plain SQuAD metric for both data
sets.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable

__all__ = ["METRICS", "normalize_answer", "exact_match", "f1", "best_score", "score_answer"]

#: The reward variants: the env's ``reward=`` picks one; both are recorded per episode.
METRICS: tuple[str, ...] = ("f1", "em")

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when both normalise to the same string, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str) -> float:
    """Token-level F1 of the normalised strings (SQuAD's ``f1_score``)."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def best_score(prediction: str | None, answers: Iterable[str], metric: str = "f1") -> float:
    """The best ``metric`` (``"f1"`` or ``"em"``) of ``prediction`` over every accepted answer.

    ``None`` (no answer) scores 0.0. ``answers`` must not be empty.
    """
    if metric not in METRICS:
        raise ValueError(f"unknown answer metric {metric!r}; choose one of {', '.join(METRICS)}")
    golds = [a for a in answers if isinstance(a, str)]
    if not golds:
        raise ValueError("no accepted answer to score against: every question needs at least one answer")
    if prediction is None:
        return 0.0
    fn = f1 if metric == "f1" else exact_match
    return max(fn(prediction, g) for g in golds)


def score_answer(prediction: str | None, answers: Iterable[str]) -> dict[str, float]:
    """``{"f1": ..., "em": ...}``: both metrics, each the best over ``answers``."""
    golds = list(answers)
    return {metric: best_score(prediction, golds, metric) for metric in METRICS}
