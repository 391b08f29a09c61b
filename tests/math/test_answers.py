"""Answer checking: finding, reading and comparing final answers; every GSM8K gold accepted."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import sympy

from agentgym_lightning.envs.math.answers import answers_match, extract_answer, gsm8k_gold, parse_answer
from agentgym_lightning.envs.math.calculator import calculate


@pytest.mark.parametrize(
    ("predicted", "gold", "rel_tol"),
    [
        ("3/4", "0.75", 0),
        ("0.75", "3/4", 0),
        ("1,000", "1000", 0),
        ("$18", "18", 0),
        ("$1,234.00", "1234", 0),
        ("18 dollars", "18", 0),
        ("18 eggs", "18", 0),
        ("18.", "18", 0),
        ("18.0", "18", 0),
        ("**18**", "18", 0),
        ("\\boxed{18}", "18", 0),
        ("\\frac{3}{4}", "0.75", 0),
        ("2*9", "18", 0),
        ("12*7 = 84", "84", 0),
        ("1/3 ≈ 0.333333333333", "1/3", 0),  # the calculator's own display
        ("2/3 = around 0.666667", "2/3", 0),  # Calc-X's
        ("about 42", "42", 0),
        ("25%", "25", 0),  # a percentage matches in both readings
        ("25%", "0.25", 0),
        ("25", "25%", 0),
        ("0.666667", "2/3", 1e-2),  # Calc-X's tolerance
        ("sqrt(2)", "2**0.5", 0),
        ("1e3", "1000", 0),
        ("C", "C", 0),
        ("(C)", "C", 0),
        ("C) 48", "C", 0),
        ("c", "C", 0),
    ],
)
def test_equivalent_answers_match(predicted, gold, rel_tol):
    assert answers_match(predicted, gold, rel_tol)


@pytest.mark.parametrize(
    ("predicted", "gold", "rel_tol"),
    [
        ("19", "18", 0),
        ("-18", "18", 0),
        ("18.5", "18", 0),
        ("0.333333333333", "1/3", 0),  # exact by default: a rounded decimal is not 1/3
        ("0.67", "2/3", 0),
        ("0.6", "2/3", 1e-2),
        ("B", "C", 0),
        ("48", "C", 0),
        ("one", "1", 0),
        ("", "1", 0),
        (None, "1", 0),
        ("__import__('os')", "0", 0),
    ],
)
def test_different_answers_do_not_match(predicted, gold, rel_tol):
    assert not answers_match(predicted, gold, rel_tol)


def test_unreadable_gold_and_bad_tolerance_are_errors():
    with pytest.raises(ValueError, match="gold answer"):
        answers_match("1", "n/a")
    with pytest.raises(ValueError, match="rel_tol"):
        answers_match("1", "1", rel_tol=-1)
    with pytest.raises(ValueError, match="####"):
        gsm8k_gold("no final line")


def test_parse_answer_reads_values_exactly():
    assert parse_answer("0.1").value == sympy.Rational(1, 10)
    assert parse_answer("25%").percent and parse_answer("25%").value == 25
    assert parse_answer("(D)").option == "D"
    assert parse_answer("x" * 20_000) is None
    assert parse_answer("hello") is None


@pytest.mark.parametrize(
    ("reply", "text", "status"),
    [
        ("Answer: 42", "42", "ok"),
        ("so 5+3=8.\nAnswer: 8 apples", "8 apples", "ok"),
        ("#### 72", "72", "ok"),
        ("\\boxed{3/4}", "3/4", "ok"),
        ("The answer is $1,234.", "$1,234.", "ok"),
        ("Answer: she has 18 dollars left", "18", "ok"),
        ("I think 12, no, 15", "15", "ok"),  # no marker: the last number
        ("Answer: none", "none", "unparsable"),
        ("no numbers here", None, "missing"),
        ("", None, "missing"),
        (None, None, "missing"),
    ],
)
def test_extract_answer(reply, text, status):
    found = extract_answer(reply)
    assert (found.text, found.status) == (text, status)


def test_extract_answer_can_require_a_marker():
    assert extract_answer("it is 15", require_marker=True).status == "missing"
    assert extract_answer("Answer: 15", require_marker=True).text == "15"


def _gsm8k(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_every_gsm8k_test_gold_is_accepted_and_perturbed_ones_rejected(gsm8k_dir: Path):
    """All 1319 test items: the gold matches itself (as written and as a plain number) and no
    perturbation of it (+-1, x10, +0.5, negated) matches."""
    items = _gsm8k(gsm8k_dir / "test.jsonl")
    assert len(items) == 1319
    failures = []
    for i, item in enumerate(items):
        gold = gsm8k_gold(item["answer"])
        value = parse_answer(gold).value
        if not (answers_match(gold, gold) and answers_match(str(value), gold) and answers_match(f"${gold}", gold)):
            failures.append((i, gold, "rejected"))
        for wrong in (value + 1, value - 1, value * 10 if value else sympy.Integer(7), value + sympy.Rational(1, 2), -value if value else 1):
            if answers_match(str(wrong), gold):
                failures.append((i, gold, f"accepted {wrong}"))
    assert not failures, failures[:10]


_ANNOTATION = re.compile(r"<<([^<>=]*)=([^<>]*)>>")


def test_calculator_agrees_with_gsm8k_calculator_annotations(gsm8k_dir: Path):
    """The 4,282 ``<<expression=value>>`` annotations of GSM8K test: each expression evaluates to
    its recorded value (to 1e-6: a few record rounded decimals)."""
    pairs = [p for item in _gsm8k(gsm8k_dir / "test.jsonl") for p in _ANNOTATION.findall(item["answer"])]
    assert len(pairs) == 4282
    results = [(e, v, calculate(e).text) for e, v in pairs]
    wrong = [r for r in results if not answers_match(r[2], r[1], 1e-6)]
    assert not wrong, wrong[:10]
