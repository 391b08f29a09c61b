"""Throughput of the math envs' calculator and answer checker, measured in one run.

1. Calculator: expressions per second on GSM8K's own ``<<expression=value>>`` annotations (test and
   train, ~28,000), and on the hostile inputs of the tests (refusals per second).
   The slowest single refusal is printed too (the tests require each within 1 s).
2. Checker: ``answers_match`` per second on every GSM8K gold (as written against its own value),
   and on perturbed golds (which it rejects).
3. For scale, the same annotations through ``sympy.sympify`` (the unsafe way: it evaluates Python
   code, which is why the calculator never uses it on model text; here it reads our own data):
   the ratio says what the safety costs, or saves.

Without ``../shared/data/gsm8k`` it runs on the bundled GSM8K sample (a few dozen expressions).

    python bench/bench_math.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import sympy

from agentgym_lightning.envs.math.answers import answers_match, gsm8k_gold, parse_answer
from agentgym_lightning.envs.math.calculator import calculate
from agentgym_lightning.envs.math.sample import GSM8K_SAMPLE

GSM8K = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k"
ANNOTATION = re.compile(r"<<([^<>=]*)=([^<>]*)>>")
HOSTILE = [
    "__import__('os').system('id')",
    "9**9**9**9",
    "factorial(10**9)",
    "(1" * 10_000,
    "().__class__.__bases__[0]",
    "a" * 100_000,
    "1\x00+1",
    "10**10**10",
    "x.y",
    "lambda: 0",
]


def _solutions() -> tuple[list[str], str]:
    if (GSM8K / "test.jsonl").is_file():
        lines = [ln for split in ("test", "train") for ln in (GSM8K / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()]
        return [json.loads(ln)["answer"] for ln in lines if ln.strip()], "GSM8K test+train"
    return [r["answer"] for records in GSM8K_SAMPLE.values() for r in records], "the bundled GSM8K sample"


def _rate(fn, items, repeat: int) -> float:
    """Items per second, best of ``repeat`` passes (sympy's cache emptied before each)."""
    best = float("inf")
    for _ in range(repeat):
        sympy.core.cache.clear_cache()
        start = time.perf_counter()
        for item in items:
            fn(item)
        best = min(best, time.perf_counter() - start)
    return len(items) / best


def _slowest(fn, items, repeat: int) -> tuple[float, str]:
    """The longest single call (best of ``repeat`` for each item) and its item."""
    times = []
    for item in items:
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            fn(item)
            best = min(best, time.perf_counter() - start)
        times.append((best, item))
    return max(times, key=lambda t: t[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="best of this many passes (default: %(default)s)")
    args = parser.parse_args()
    solutions, source = _solutions()
    expressions = [e for s in solutions for e, _ in ANNOTATION.findall(s)]
    golds = [gsm8k_gold(s) for s in solutions]
    perturbed = [(str(parse_answer(g).value + 1), g) for g in golds]
    print(f"data: {source}: {len(expressions)} annotations, {len(golds)} golds")

    calc = _rate(calculate, expressions, args.repeat)
    refuse = _rate(calculate, HOSTILE, args.repeat * 20)
    check = _rate(lambda g: answers_match(g, g), golds, args.repeat)
    reject = _rate(lambda pg: answers_match(*pg), perturbed, args.repeat)
    same = expressions[:2000]  # sympify is slow: the ratio compares both on these
    naive = _rate(sympy.sympify, same, args.repeat)
    calc_same = _rate(calculate, same, args.repeat)
    print(f"calculator           {calc:10.0f} expressions/s")
    slowest, which = _slowest(calculate, HOSTILE, args.repeat)
    print(f"calculator, hostile  {refuse:10.0f} refusals/s (slowest {slowest * 1e3:.2f} ms: {which[:30]!r})")
    print(f"checker, gold        {check:10.0f} checks/s")
    wrongly_accepted = sum(answers_match(p, g) for p, g in perturbed)
    print(f"checker, perturbed   {reject:10.0f} checks/s ({wrongly_accepted} of {len(perturbed)} accepted)")
    print(f"sympy.sympify        {naive:10.0f} expressions/s (unsafe; for scale)")
    print(f"ratio calculator / sympify (same {len(same)} expressions, one run): {calc_same / naive:.2f}")


if __name__ == "__main__":
    main()
