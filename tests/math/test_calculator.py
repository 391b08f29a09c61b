"""The safe calculator: what it computes, and that hostile input is refused fast with no code run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sympy

from agentgym_lightning.envs.math.calculator import (
    CalculatorError,
    CalculatorLimits,
    calculate,
    evaluate,
    format_value,
)


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("12 * (3 + 4)", 84),
        ("3/4", sympy.Rational(3, 4)),
        ("0.1 + 0.2", sympy.Rational(3, 10)),  # exact, not 0.30000000000000004
        ("2^10", 1024),
        ("2**10", 1024),
        ("1,000,000 + 1", 1_000_001),
        ("1,000.5 * 2", 2001),
        ("max(5,100)", 100),  # a comma inside a call separates arguments
        ("2(3+4)", 14),
        ("(2)(3)", 6),
        ("50*20%", 10),
        ("20%", sympy.Rational(1, 5)),
        ("7 % 3", 1),
        ("12*7=", 84),
        ("-2**2", -4),
        ("12 × 3 ÷ 4 − 1", 8),
        ("sqrt(16/9)", sympy.Rational(4, 3)),
        ("log10(1000)", 3),  # exact when the logarithm is a whole number
        ("log(1/8, 2)", -3),
        ("factorial(5)", 120),
        ("round(2.5)", 3),
        ("round(3.14159, 2)", sympy.Rational(157, 50)),
        ("floor(-2.5)", -3),
        ("ceil(2.1)", 3),
        ("gcd(12, 18)", 6),
        ("lcm(4, 6)", 12),
        ("10 // 3", 3),
        ("abs(-3)", 3),
        ("1.5e3 / 2", 750),
        (".5", sympy.Rational(1, 2)),
    ],
)
def test_exact_values(expression, value):
    assert evaluate(expression) == value


def test_numeric_values_and_display():
    assert abs(float(evaluate("sqrt(2)")) - 2**0.5) < 1e-15
    assert abs(float(evaluate("sin(pi/2)")) - 1) < 1e-15
    assert abs(float(evaluate("e**2")) - 7.38905609893065) < 1e-12
    assert calculate("84").text == "84"
    assert calculate("3/4").text == "3/4 = 0.75"
    assert calculate("1/3").text == "1/3 ≈ 0.333333333333"
    assert calculate("sqrt(2)").text == "1.41421356237"
    assert calculate("2**3000").text == "1.23023192216e+903"  # long values stay short
    assert format_value(sympy.Integer(10) ** 29) == "1" + "0" * 29


@pytest.mark.parametrize(
    ("expression", "kind"),
    [
        ("", "empty"),
        ("x + 1", "forbidden"),
        ("os.system", "forbidden"),
        ("True", "forbidden"),
        ("1j", "forbidden"),
        ("0x1F", "syntax"),
        ("1 if 1 else 2", "forbidden"),
        ("1,0000", "forbidden"),  # not a thousands separator: a tuple
        ("[1, 2]", "forbidden"),
        ("round(x=1)", "forbidden"),
        ("lambda: 1", "forbidden"),
        ("1/0", "math"),
        ("0**-1", "math"),
        ("log(0)", "math"),
        ("(-8)**(1/3)", "math"),
        ("acos(2)", "math"),
        ("exp(10000)", "limit"),
        ("10**10000", "limit"),
        ("1e999999", "limit"),
        ("(" * 21 + "1" + ")" * 21, "limit"),
        ("+".join(["1"] * 60), "limit"),
        ("min()", "syntax"),
        ("(1 + 2", "syntax"),
    ],
)
def test_refusals_name_their_kind(expression, kind):
    result = calculate(expression)
    assert not result.ok and result.error == kind and result.text.startswith("Error: ")
    with pytest.raises(CalculatorError):
        evaluate(expression)


def test_limits_are_configurable_and_checked():
    assert calculate("2**20", CalculatorLimits(max_digits=5)).error == "limit"
    assert calculate("factorial(20)", CalculatorLimits(max_factorial=10)).error == "limit"
    assert calculate("1+1", CalculatorLimits(max_chars=2)).error == "too_long"
    with pytest.raises(ValueError, match="max_chars"):
        CalculatorLimits(max_chars=0)


#: The issue's hostile inputs and their relatives.
HOSTILE = [
    "__import__('os').system('touch {canary}')",
    "9**9**9**9",
    "factorial(10**9)",
    "(1" * 10_000,
    "os.system('touch {canary}')",
    "open('{canary}', 'w')",
    "().__class__.__bases__[0].__subclasses__()",
    "globals()",
    "exec('import os')",
    "eval('1')",
    "lambda: 0",
    "a" * 100_000,
    "1" * 100_000,
    "1\x00+1",
    "\x00",
    "2**2**2**2**2**2",
    "10**10**10",
    "factorial(300)*factorial(300)*factorial(300)*factorial(300)",
    "sin(10**300)",
    "-" * 299 + "1",
    "((((((((((((((((((((((((((((((1))))))))))))))))))))))))))))))",
    "1e-99999",
    "'1' * 10**9",
    "b'x'",
    "f'{{1}}'",
    "[x for x in range(10**9)]",
    "x.__dict__",
    "sqrt(2)**sqrt(3)**sqrt(5)**sqrt(7)**9999",
]

_PROBE = r"""
import json, sys, time
from agentgym_lightning.envs.math.calculator import calculate
calculate("1 + 1")  # warm up: imports are done before the hook watches
events = []
WATCH = ("exec", "os.system", "os.exec", "os.posix_spawn", "os.fork", "subprocess.Popen", "open", "import",
         "socket.", "ctypes.", "builtins.input", "os.remove", "shutil.")
def hook(event, args):
    if event.startswith(WATCH):
        events.append(event)
sys.addaudithook(hook)
out = []
for text in json.loads(sys.stdin.read()):
    start = time.thread_time()
    result = calculate(text)
    out.append({"ok": result.ok, "error": result.error, "cpu_s": time.thread_time() - start})
print(json.dumps({"results": out, "events": events}))
"""


def test_hostile_input_is_refused_fast_and_runs_nothing(tmp_path: Path):
    """Each hostile input, in a child process that watches Python's audit events (exec, eval,
    open, imports, process spawns, sockets): refused, within 1 s of CPU each, with not a single
    watched event, and the canary file the payloads try to create does not exist."""
    canary = tmp_path / "pwned"
    inputs = [text.replace("{canary}", str(canary)) for text in HOSTILE]
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE], input=json.dumps(inputs), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["events"] == []
    assert not canary.exists()
    for text, result in zip(inputs, report["results"]):
        assert not result["ok"], text[:80]
        assert result["cpu_s"] < 1.0, (text[:80], result)


def test_hostile_input_in_process_never_raises_and_is_refused():
    for text in HOSTILE:
        started = time.thread_time()
        result = calculate(text.replace("{canary}", "/nonexistent/x"))
        assert not result.ok and result.error is not None
        assert time.thread_time() - started < 1.0
    assert calculate(None).error == "syntax"  # type: ignore[arg-type]
    assert calculate(b"1+1").error == "syntax"  # type: ignore[arg-type]


def test_no_eval_sympify_or_parse_expr_in_the_calculator():
    """The calculator's own code calls nothing that executes text (checked on its syntax tree)."""
    import ast

    path = Path(__file__).resolve().parents[2] / "envs" / "math" / "calculator.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    banned = {"eval", "exec", "compile", "sympify", "parse_expr", "__import__", "S"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name):
                assert func.id not in banned, f"line {node.lineno}: {func.id}()"
            elif isinstance(func, ast.Attribute) and func.attr in banned:
                assert func.attr == "compile" and isinstance(func.value, ast.Name) and func.value.id == "re", (
                    f"line {node.lineno}: .{func.attr}()"
                )
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            assert not any("parsing" in n for n in names), f"line {node.lineno}: imports a parser that evaluates"


def test_parallel_calculations_do_not_disturb_each_other():
    """Agents calculate in parallel threads; each has its own numeric precision context."""
    from concurrent.futures import ThreadPoolExecutor

    expressions = ["sqrt(2)", "log(3)", "sin(1)", "2**0.5**2", "exp(7)", "pi", "1/7"] * 30
    expected = [calculate(e).text for e in expressions]
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(lambda e: calculate(e).text, expressions)) == expected
