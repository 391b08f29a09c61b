"""Arithmetic problems generated from a seed: the tasks of ``lightning/Arithmetic-v0``.

A problem is an expression of ``steps + 1`` operands of ``digits`` digits joined by operators
drawn from ``operators``, asked as ``"What is 347 * 26?"``; its answer is a whole number
(divisions are built to come out even, and with ``allow_negative=False`` no answer is below zero).
Standard precedence applies (``12 + 7 * 3`` is 33); the calculator knows it, the model need
only copy the expression.

Two kinds of supply, never overlapping:

* **train** — endless: :meth:`ArithmeticTasks.sample` draws a fresh problem from any
  ``numpy`` generator (the env's, so ``reset(seed=...)`` reproduces it) and redraws any
  problem that is in the held-out set;
* **test** — the held-out set: ``heldout_size`` problems drawn once from a fixed seed stream of
  their own (:data:`HELDOUT_SEED`, the difficulty), the same on every machine.

The numbered levels (:data:`LEVELS`) are the presets the zero-shot numbers in
``envs/math/README.md`` were measured on; any :class:`Difficulty` works.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import sympy

from .calculator import DEFAULT_LIMITS, evaluate

__all__ = ["Difficulty", "LEVELS", "HELDOUT_SEED", "ArithmeticTasks", "make_problem", "resolve_difficulty"]

#: The root seed of every held-out set (the difficulty is mixed in).
HELDOUT_SEED = 20_251_122
_OPERATORS = "+-*/"


@dataclass(frozen=True)
class Difficulty:
    """How hard a problem is."""

    #: Digits of each operand: drawn from ``10**(digits-1) .. 10**digits - 1`` (1 .. 9 for one
    #: digit). Divisors are single digits 2 .. 9, and a dividend is rounded to their multiple.
    digits: int = 2
    #: The operators to draw from, a string over ``+-*/``.
    operators: str = "+-"
    #: Operations per problem (operands: ``steps + 1``).
    steps: int = 1
    #: Allow answers below zero.
    allow_negative: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.digits <= 12:
            raise ValueError(f"digits must be 1 to 12, got {self.digits}")
        if not 1 <= self.steps <= 8:
            raise ValueError(f"steps must be 1 to 8, got {self.steps}")
        if not self.operators or any(op not in _OPERATORS for op in self.operators):
            raise ValueError(f"operators must be a non-empty string over {_OPERATORS!r}, got {self.operators!r}")
        if len(set(self.operators)) != len(self.operators):
            raise ValueError(f"operators repeats a character: {self.operators!r}")

    @property
    def key(self) -> str:
        """A short stable name: ``d2-ops+--s1``."""
        return f"d{self.digits}-ops{self.operators}-s{self.steps}" + ("-neg" if self.allow_negative else "")


#: The preset levels, easiest first.
LEVELS: dict[int, Difficulty] = {
    1: Difficulty(digits=2, operators="+-", steps=1),
    2: Difficulty(digits=3, operators="+-*", steps=1),
    3: Difficulty(digits=2, operators="+-*", steps=2),
    4: Difficulty(digits=3, operators="+-*/", steps=3),
}


def resolve_difficulty(difficulty: int | Difficulty | dict[str, Any] | None = None, **overrides: Any) -> Difficulty:
    """A :class:`Difficulty` from a level number, an instance, or a dict; ``overrides``
    (``digits=``, ``operators=``, ``steps=``, ``allow_negative=``) replace its fields."""
    if difficulty is None:
        base = LEVELS[1]
    elif isinstance(difficulty, Difficulty):
        base = difficulty
    elif isinstance(difficulty, dict):
        base = Difficulty(**difficulty)
    elif isinstance(difficulty, int) and not isinstance(difficulty, bool):
        if difficulty not in LEVELS:
            raise ValueError(f"unknown difficulty level {difficulty}; choose one of {sorted(LEVELS)} or give a Difficulty")
        base = LEVELS[difficulty]
    else:
        raise TypeError(f"difficulty must be a level number, a Difficulty or a dict, not {type(difficulty).__name__}")
    fields = {k: v for k, v in overrides.items() if v is not None}
    return Difficulty(**{**asdict(base), **fields}) if fields else base


def _operand(rng: np.random.Generator, digits: int) -> int:
    low = 1 if digits == 1 else 10 ** (digits - 1)
    return int(rng.integers(low, 10**digits))


#: The calculator's limits for computing a generated problem's answer: its own (bounded size,
#: digits, depth) but a wall-clock limit no loaded machine reaches. The agent's 0.5 s is a guard
#: against hostile input; on a problem we wrote, a timeout under load killed training runs.
_ANSWER_LIMITS = replace(DEFAULT_LIMITS, time_limit_s=3600.0)


def make_problem(rng: np.random.Generator, difficulty: Difficulty, max_tries: int = 1000) -> tuple[str, int]:
    """One ``(expression, answer)`` drawn with ``rng`` (redrawn until it meets the difficulty's rules)."""
    for _ in range(max_tries):
        ops = [difficulty.operators[int(rng.integers(len(difficulty.operators)))] for _ in range(difficulty.steps)]
        operands = [_operand(rng, difficulty.digits) for _ in range(difficulty.steps + 1)]
        # Make every division come out even: a run "x / a / b" needs x to be a multiple of a*b.
        i = 0
        while i < len(ops):
            if ops[i] != "/":
                i += 1
                continue
            j = i
            divisor = 1
            while j < len(ops) and ops[j] == "/":
                operands[j + 1] = int(rng.integers(2, 10))
                divisor *= operands[j + 1]
                j += 1
            # the dividend is the operand before the run (a product "a * b / c": b carries it)
            operands[i] = max(1, operands[i] // divisor) * divisor
            i = j
        parts = [str(operands[0])]
        for op, x in zip(ops, operands[1:]):
            parts.append(f" {op} {x}")
        expression = "".join(parts)
        value = evaluate(expression, _ANSWER_LIMITS)
        if not isinstance(value, sympy.Integer):
            continue
        if value < 0 and not difficulty.allow_negative:
            continue
        return expression, int(value)
    raise RuntimeError(f"no problem met the rules of {difficulty} in {max_tries} tries")


def _task(expression: str, answer: int, difficulty: Difficulty, task_id: str, split: str) -> dict[str, Any]:
    return {
        "id": task_id,
        "split": split,
        "question": f"What is {expression}?",
        "expression": expression,
        "answer": str(answer),
        "difficulty": asdict(difficulty),
    }


class ArithmeticTasks:
    """The train and held-out problems of one difficulty.

    ``tasks = ArithmeticTasks(Difficulty(digits=3, operators="+-*", steps=2))``;
    ``tasks.sample(rng)`` draws a training problem, ``tasks.heldout`` is the test list.
    Calling the object is :meth:`sample`, so it can be an :class:`~agentgym_lightning.env.AgentEnv`
    task source directly.
    """

    def __init__(self, difficulty: Difficulty, heldout_size: int = 200) -> None:
        if heldout_size < 1:
            raise ValueError(f"heldout_size must be at least 1, got {heldout_size}")
        self.difficulty = difficulty
        seed_key = int.from_bytes(hashlib.sha256(difficulty.key.encode()).digest()[:4], "big")
        rng = np.random.default_rng([HELDOUT_SEED, seed_key])
        self.heldout: list[dict[str, Any]] = []
        seen: set[str] = set()
        tries = 0
        while len(self.heldout) < heldout_size:
            expression, answer = make_problem(rng, difficulty)
            tries += 1
            if expression in seen:
                if tries > 50 * heldout_size:
                    raise ValueError(
                        f"{difficulty} has fewer than {heldout_size} distinct problems; lower heldout_size"
                    )
                continue
            seen.add(expression)
            task_id = f"arith-{difficulty.key}-test-{len(self.heldout)}"
            self.heldout.append(_task(expression, answer, difficulty, task_id, "test"))
        self._heldout_expressions = frozenset(seen)

    def sample(self, rng: np.random.Generator) -> dict[str, Any]:
        """A training problem that is not in the held-out set."""
        for _ in range(10_000):
            expression, answer = make_problem(rng, self.difficulty)
            if expression not in self._heldout_expressions:
                digest = hashlib.sha1(expression.encode()).hexdigest()[:10]
                return _task(expression, answer, self.difficulty, f"arith-{self.difficulty.key}-{digest}", "train")
        raise RuntimeError(f"every problem drawn from {self.difficulty} is held out; use a larger difficulty")

    __call__ = sample
