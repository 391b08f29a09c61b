"""Generated arithmetic problems: deterministic, correct, whole, and a held-out set never drawn for training."""

from __future__ import annotations

import numpy as np
import pytest

from agentgym_lightning.envs.math.arithmetic import LEVELS, ArithmeticTasks, Difficulty, make_problem, resolve_difficulty
from agentgym_lightning.envs.math.calculator import evaluate


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_problems_are_correct_whole_and_follow_the_difficulty(level):
    difficulty = LEVELS[level]
    rng = np.random.default_rng(0)
    for _ in range(200):
        expression, answer = make_problem(rng, difficulty)
        assert evaluate(expression) == answer and answer >= 0
        operands = expression.split(" ")[::2]
        operators = expression.split(" ")[1::2]
        assert len(operators) == difficulty.steps and set(operators) <= set(difficulty.operators)
        divisors = {int(operands[i + 1]) for i, op in enumerate(operators) if op == "/"}
        for i, x in enumerate(operands):
            if i > 0 and operators[i - 1] == "/":
                assert 2 <= int(x) <= 9
            elif int(x) not in divisors:
                assert len(x) <= difficulty.digits


def test_negative_answers_only_when_allowed():
    rng = np.random.default_rng(1)
    answers = [make_problem(rng, Difficulty(digits=2, operators="-", steps=2, allow_negative=True))[1] for _ in range(100)]
    assert min(answers) < 0
    rng = np.random.default_rng(1)
    assert min(make_problem(rng, Difficulty(digits=2, operators="-", steps=2))[1] for _ in range(100)) >= 0


def test_heldout_set_is_fixed_distinct_and_never_drawn_for_training():
    small = Difficulty(digits=1, operators="+", steps=1)  # only 81 problems exist
    tasks = ArithmeticTasks(small, heldout_size=30)
    again = ArithmeticTasks(small, heldout_size=30)
    assert [t["question"] for t in tasks.heldout] == [t["question"] for t in again.heldout]
    assert len({t["expression"] for t in tasks.heldout}) == 30
    heldout = {t["expression"] for t in tasks.heldout}
    rng = np.random.default_rng(0)
    drawn = {tasks.sample(rng)["expression"] for _ in range(2000)}
    assert drawn.isdisjoint(heldout) and len(drawn) == 81 - 30  # the rest, every one of them
    first = tasks.heldout[0]
    assert first["split"] == "test" and first["id"] == "arith-d1-ops+-s1-test-0"
    assert first["question"] == f"What is {first['expression']}?" and evaluate(first["expression"]) == int(first["answer"])


def test_heldout_sets_differ_by_difficulty_and_are_stable_across_runs():
    one = ArithmeticTasks(LEVELS[1], heldout_size=5).heldout
    two = ArithmeticTasks(LEVELS[2], heldout_size=5).heldout
    assert {t["expression"] for t in one}.isdisjoint({t["expression"] for t in two})
    # Recorded once: the held-out set must not change between versions or machines.
    assert [t["question"] for t in one[:3]] == ["What is 11 + 18?", "What is 74 + 39?", "What is 97 + 26?"]


def test_training_draws_follow_the_rng():
    tasks = ArithmeticTasks(LEVELS[3], heldout_size=10)
    a = [tasks(np.random.default_rng(7))["question"] for _ in range(3)]
    b = [tasks(np.random.default_rng(7))["question"] for _ in range(3)]
    assert a == b
    rng = np.random.default_rng(7)
    assert len({tasks(rng)["question"] for _ in range(50)}) > 40


def test_too_many_heldout_problems_is_a_clear_error():
    with pytest.raises(ValueError, match="fewer than 100 distinct problems"):
        ArithmeticTasks(Difficulty(digits=1, operators="+", steps=1), heldout_size=100)


def test_resolve_difficulty():
    assert resolve_difficulty(2) == LEVELS[2]
    assert resolve_difficulty(2, steps=3).steps == 3 and resolve_difficulty(2, steps=3).digits == LEVELS[2].digits
    assert resolve_difficulty({"digits": 4, "operators": "*"}) == Difficulty(digits=4, operators="*")
    with pytest.raises(ValueError, match="unknown difficulty level"):
        resolve_difficulty(9)
    with pytest.raises(ValueError, match="operators"):
        Difficulty(operators="+^")
    with pytest.raises(ValueError, match="digits"):
        Difficulty(digits=0)


def test_a_loaded_machine_does_not_fail_problem_generation(monkeypatch):
    # Each clock read a second later: the calculator's own 0.5 s limit would time every problem
    # out (as it did two training runs on a machine at load 12); generating tasks must not care.
    from itertools import count

    from agentgym_lightning.envs.math import calculator

    ticks = count()
    monkeypatch.setattr(calculator.time, "monotonic", lambda: float(next(ticks)))
    with pytest.raises(calculator.CalculatorError, match="more than 0.5 s"):
        calculator.evaluate("12 * 34 + 5")
    expression, answer = make_problem(np.random.default_rng(0), resolve_difficulty(3))
    assert answer == int(calculator.evaluate(expression, calculator.CalculatorLimits(time_limit_s=1e9)))
