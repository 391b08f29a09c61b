"""A safe calculator for expressions a model wrote: parsed, never executed.

The expression is read by Python's own parser (:func:`ast.parse`, the tokenizer sympy's parser
uses too), checked node by node against a small grammar, and then *computed by us* with sympy
numbers. Nothing is ever executed: no ``eval``, no ``sympify``, no ``parse_expr`` (all three
evaluate Python code, which is how model text could reach ``__import__('os')``).

The grammar::

    expr     := number | constant | expr OP expr | ("+" | "-") expr | "(" expr ")" | call
    OP       := + - * / // % **          (^ is read as **, × as *, ÷ as /, − as -)
    number   := decimal digits, optional fraction and exponent: 12, 1.5, .5, 2e3;
                thousands separators outside calls: 1,000,000
    constant := pi | e
    call     := FUNCTION "(" expr ("," expr)* ")"
    FUNCTION := sqrt abs round floor ceil exp log ln log10 log2 sin cos tan asin acos atan
                factorial gcd lcm min max

``%`` right after a number and not followed by one is a percent (``20%`` is ``0.2``,
``50*20%`` is ``10``); between two numbers it is the remainder (``7 % 3`` is ``1``). A number or
``)`` directly before ``(`` multiplies (``2(3+4)`` is ``14``). A trailing ``=`` is ignored.

Anything else — names, attributes, subscripts, strings, lambdas, comparisons, keyword arguments,
underscores, quotes, brackets — is rejected before parsing or by the node check. Limits
(:class:`CalculatorLimits`) bound the length, the nesting depth, the number of nodes, every
exponent, every intermediate result's size and ``factorial``'s argument; each operation is
checked *before* it runs, so none can take long by itself, and a deadline is checked between
operations.

Values are exact rationals (``sympy.Rational``) while they can be: ``+ - * /``, integer powers,
and roots of perfect powers (``sqrt(16)`` is exactly 4). Everything else (``sqrt(2)``, ``sin``,
``log``) is a ``sympy.Float`` with :attr:`CalculatorLimits.precision` significant digits.

    >>> calculate("12 * (3 + 4)").text
    '84'
    >>> calculate("3/4").text
    '3/4 = 0.75'
    >>> calculate("1/3").text
    '1/3 ≈ 0.333333333333'
    >>> calculate("__import__('os')").error
    'forbidden'
"""

from __future__ import annotations

import ast
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mpmath
import sympy

__all__ = [
    "CalculatorLimits",
    "CalcResult",
    "CalculatorError",
    "ERROR_KINDS",
    "FUNCTIONS",
    "CONSTANTS",
    "calculate",
    "evaluate",
    "format_value",
]

#: The categories of :attr:`CalcResult.error`.
ERROR_KINDS: tuple[str, ...] = ("empty", "too_long", "forbidden", "syntax", "limit", "math", "timeout")


@dataclass(frozen=True)
class CalculatorLimits:
    """What one expression may cost. Every field bounds work done *before* it is done."""

    #: Characters of the expression (checked first, so a 100 kB string costs nothing).
    max_chars: int = 300
    #: Nesting depth of parentheses.
    max_depth: int = 20
    #: Numbers, operators, constants and calls in the expression.
    max_nodes: int = 100
    #: Largest ``|exponent|`` of a power whose result is exact.
    max_exponent: int = 10_000
    #: Most decimal digits of any exact intermediate result (numerator and denominator each),
    #: and largest decimal exponent of a numeric one (``|x| < 10**max_digits``).
    max_digits: int = 1_000
    #: Largest argument of ``factorial`` (300! has 615 digits).
    max_factorial: int = 300
    #: Significant digits of values that are not rational (``sqrt(2)``, ``sin(1)``).
    precision: int = 30
    #: Seconds one expression may take; checked between operations.
    time_limit_s: float = 0.5

    def __post_init__(self) -> None:
        for name in ("max_chars", "max_depth", "max_nodes", "max_exponent", "max_digits", "max_factorial", "precision"):
            if getattr(self, name) < 1:
                raise ValueError(f"CalculatorLimits.{name} must be at least 1, got {getattr(self, name)}")
        if self.time_limit_s <= 0:
            raise ValueError(f"CalculatorLimits.time_limit_s must be > 0, got {self.time_limit_s}")


DEFAULT_LIMITS = CalculatorLimits()


class CalculatorError(ValueError):
    """An expression the calculator refuses; ``kind`` is one of :data:`ERROR_KINDS`."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class CalcResult:
    """The calculator's answer: a value, or an error. ``text`` is what the model is shown."""

    expression: str
    #: The value (``sympy.Rational`` or ``sympy.Float``); ``None`` on error.
    value: sympy.Expr | None
    #: ``"84"``, ``"3/4 = 0.75"``, or ``"Error: ..."``.
    text: str
    #: ``None`` on success, else one of :data:`ERROR_KINDS`.
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


# --------------------------------------------------------------------------- text → AST

# Everything the grammar can be written with. Quotes, brackets, braces, underscores, '@', ';',
# ':', '=', '!', '\\', '[', ']', and every control character (NUL included) fail here.
_ALLOWED_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ+-*/%^()., \t×÷−·")
_TRANSLATE = str.maketrans({"×": "*", "·": "*", "÷": "/", "−": "-", "\t": " "})
_DECIMAL = re.compile(r"(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\Z")
_LITERAL_PARTS = re.compile(r"(\d*)\.?(\d*)(?:[eE]([+-]?\d+))?\Z")
_THOUSANDS = re.compile(r"\d{1,3}(?:,\d{3})+(?=\.\d|[^\d,.]|\Z)")
_NUMBER_BEFORE_PAREN = re.compile(r"(?<![A-Za-z0-9_.])(\d+(?:\.\d*)?|\.\d+)\s*\(")
_PAREN_BEFORE_OPERAND = re.compile(r"\)\s*(?=[\d.(A-Za-z])")
_PERCENT = re.compile(r"(?<=[\d.)])\s*%(?!\s*[\d.(A-Za-z])")


def _remove_thousands_separators(text: str) -> str:
    """Drop commas that group digits by three, except inside a call's parentheses (where a comma
    separates arguments: ``max(5,100)``)."""
    out: list[str] = []
    stack: list[bool] = []  # for each open '(': is it a call's?
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "(":
            j = len(out) - 1
            while j >= 0 and out[j] == " ":
                j -= 1
            stack.append(j >= 0 and (out[j].isalpha() or (out[j].isdigit() and _ends_with_name(out, j))))
        elif ch == ")":
            if stack:
                stack.pop()
        elif ch.isdigit() and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == ".")) and not (stack and stack[-1]):
            match = _THOUSANDS.match(text, i)
            if match:
                out.append(match.group().replace(",", ""))
                i = match.end()
                continue
        out.append(ch)
        i += 1
    return "".join(out)


def _ends_with_name(out: list[str], j: int) -> bool:
    """Whether the digits ending at ``out[j]`` are the tail of a name (``log10``)."""
    while j >= 0 and out[j].isdigit():
        j -= 1
    return j >= 0 and out[j].isalpha()


def _normalize(text: str, limits: CalculatorLimits) -> str:
    if not isinstance(text, str):
        raise CalculatorError("syntax", f"the expression must be text, not {type(text).__name__}")
    if len(text) > limits.max_chars:
        raise CalculatorError("too_long", f"the expression is {len(text)} characters long; the limit is {limits.max_chars}")
    text = text.strip().rstrip("=").rstrip()  # "12*7=": the model wrote what it wants computed
    if not text:
        raise CalculatorError("empty", "the expression is empty")
    bad = next((c for c in text if c not in _ALLOWED_CHARS), None)
    if bad is not None:
        raise CalculatorError(
            "forbidden", f"character {bad!r} is not allowed: use numbers, + - * / ** ^ %, parentheses and math functions"
        )
    text = text.translate(_TRANSLATE).replace("^", "**")
    depth = deepest = 0
    for c in text:
        depth += (c == "(") - (c == ")")
        deepest = max(deepest, depth)
        if depth < 0:
            raise CalculatorError("syntax", "unbalanced parentheses: a ')' closes nothing")
    if deepest > limits.max_depth:
        raise CalculatorError("limit", f"parentheses are nested {deepest} deep; the limit is {limits.max_depth}")
    if depth:
        raise CalculatorError("syntax", f"unbalanced parentheses: {depth} '(' not closed")
    text = _remove_thousands_separators(text)
    text = _NUMBER_BEFORE_PAREN.sub(r"\1*(", text)
    text = _PAREN_BEFORE_OPERAND.sub(")*", text)
    return _PERCENT.sub("*(1/100)", text)


def _parse(text: str, limits: CalculatorLimits) -> ast.expr:
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        msg = getattr(exc, "msg", None) or str(exc) or type(exc).__name__
        raise CalculatorError("syntax", f"not an arithmetic expression ({msg})") from None
    return tree.body


# --------------------------------------------------------------------------- AST → value

Number = sympy.Rational | sympy.Float

_local = threading.local()


def _mp_context(dps: int) -> Any:
    """This thread's own mpmath context at ``dps`` digits: ``mpmath.workdps`` changes one global
    precision, which calculators running in parallel agent threads would change under each other."""
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        ctx = _local.ctx = mpmath.MPContext()
    ctx.dps = dps
    return ctx


def _digits(n: int) -> int:
    """Decimal digits of ``|n|`` (from its bit length: exact enough, and free)."""
    return int(abs(n).bit_length() * 0.30103) + 1


class _Evaluator:
    """Computes a checked AST bottom-up; every operation's size is checked before it runs."""

    def __init__(self, source: str, limits: CalculatorLimits) -> None:
        self.source = source
        self.limits = limits
        self.ctx = _mp_context(limits.precision + 5)
        self.deadline = time.monotonic() + limits.time_limit_s
        self.nodes = 0

    # ---- size checks

    def check(self, value: Any) -> Any:
        lim = self.limits
        if isinstance(value, sympy.Rational):
            if max(_digits(value.p), _digits(value.q)) > lim.max_digits:
                raise CalculatorError("limit", f"a result has more than {lim.max_digits} digits")
        elif isinstance(value, sympy.Float):
            m = value._mpf_
            if m in (mpmath.libmp.finf, mpmath.libmp.fninf, mpmath.libmp.fnan):
                raise CalculatorError("math", "the result is not a finite number")
            if value != 0 and abs(self.ctx.log10(abs(self.ctx.mpf(m)))) > lim.max_digits:
                raise CalculatorError("limit", f"a result is outside 10**-{lim.max_digits} .. 10**{lim.max_digits}")
        if time.monotonic() > self.deadline:
            raise CalculatorError("timeout", f"the expression took more than {lim.time_limit_s} s")
        return value

    def to_float(self, x: Number) -> sympy.Float:
        return sympy.Float(x, self.limits.precision)

    def mp(self, x: Number) -> Any:
        return self.ctx.mpf(self.to_float(x)._mpf_)

    def from_mp(self, x: Any) -> sympy.Float:
        if isinstance(x, self.ctx.mpc) or not self.ctx.isfinite(x):
            raise CalculatorError("math", "the result is not a finite real number")
        return self.check(sympy.Float(x, self.limits.precision))

    # ---- the walk

    def value_of(self, node: ast.expr) -> Number:
        self.nodes += 1
        if self.nodes > self.limits.max_nodes:
            raise CalculatorError("limit", f"the expression has more than {self.limits.max_nodes} parts")
        if isinstance(node, ast.Constant):
            return self.number(node)
        if isinstance(node, ast.Name):
            if node.id in CONSTANTS:
                return self.from_mp(CONSTANTS[node.id](self.ctx))
            raise CalculatorError("forbidden", f"unknown name {node.id!r}: only numbers, pi, e and math functions are allowed")
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
            value = self.value_of(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left = self.value_of(node.left)
            right = self.value_of(node.right)
            return self.check(_BINARY[type(node.op)](self, left, right))
        if isinstance(node, ast.Call):
            return self.call(node)
        raise CalculatorError("forbidden", f"{_describe(node)} is not allowed in an arithmetic expression")

    def number(self, node: ast.Constant) -> Number:
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise CalculatorError("forbidden", f"{_describe(node)} is not allowed in an arithmetic expression")
        text = ast.get_source_segment(self.source, node) or ""
        if not _DECIMAL.match(text):
            raise CalculatorError("syntax", f"{text!r} is not a decimal number")
        whole, frac, exp = _LITERAL_PARTS.match(text).groups()  # type: ignore[union-attr]
        exponent = int(exp or 0)
        if abs(exponent) > self.limits.max_digits:
            raise CalculatorError("limit", f"{text!r} is beyond 10**{self.limits.max_digits}")
        mantissa = int((whole + frac) or "0")
        shift = exponent - len(frac)
        value = sympy.Integer(mantissa) * sympy.Integer(10) ** shift if shift >= 0 else sympy.Rational(mantissa, 10**-shift)
        return self.check(value)

    def call(self, node: ast.Call) -> Number:
        if not isinstance(node.func, ast.Name):
            raise CalculatorError("forbidden", f"{_describe(node.func)} cannot be called: only math functions by name")
        name = node.func.id
        if name not in FUNCTIONS:
            raise CalculatorError("forbidden", f"unknown function {name!r}; allowed: {', '.join(sorted(FUNCTIONS))}")
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            raise CalculatorError("forbidden", f"{name}() takes plain arguments only")
        low, high, fn = FUNCTIONS[name]
        if not low <= len(node.args) <= high:
            want = str(low) if low == high else f"{low} to {high}"
            raise CalculatorError("syntax", f"{name}() takes {want} argument{'s' if high > 1 else ''}, got {len(node.args)}")
        args = [self.value_of(a) for a in node.args]
        return self.check(fn(self, *args))

    # ---- operations (each checks its cost first)

    def add(self, a: Number, b: Number) -> Number:
        return a + b

    def sub(self, a: Number, b: Number) -> Number:
        return a - b

    def mul(self, a: Number, b: Number) -> Number:
        if isinstance(a, sympy.Rational) and isinstance(b, sympy.Rational):
            if max(_digits(a.p) + _digits(b.p), _digits(a.q) + _digits(b.q)) > self.limits.max_digits + 1:
                raise CalculatorError("limit", f"a product has more than {self.limits.max_digits} digits")
        return a * b

    def div(self, a: Number, b: Number) -> Number:
        if b == 0:
            raise CalculatorError("math", "division by zero")
        return self.mul(a, 1 / b if isinstance(b, sympy.Float) else sympy.Rational(b.q, b.p))

    def floordiv(self, a: Number, b: Number) -> Number:
        return self.floor(self.div(a, b))

    def mod(self, a: Number, b: Number) -> Number:
        if b == 0:
            raise CalculatorError("math", "remainder of a division by zero")
        return a - b * self.floordiv(a, b)

    def power(self, base: Number, exponent: Number) -> Number:
        lim = self.limits
        if isinstance(exponent, sympy.Integer) and isinstance(base, sympy.Rational):
            n = int(exponent)
            if base == 0 and n < 0:
                raise CalculatorError("math", "zero to a negative power")
            if base in (0, 1, -1):
                return base**n
            if abs(n) > lim.max_exponent:
                raise CalculatorError("limit", f"exponent {n} is larger than {lim.max_exponent}")
            if max(_digits(base.p), _digits(base.q)) * abs(n) > lim.max_digits + abs(n):
                raise CalculatorError("limit", f"the power has more than {lim.max_digits} digits")
            return base**n
        if isinstance(exponent, sympy.Rational) and isinstance(base, sympy.Rational) and base >= 0:
            root = self.exact_root(base, int(exponent.q))
            if root is not None:
                return self.power(root, sympy.Integer(exponent.p))
        if base < 0 and not (isinstance(exponent, sympy.Integer)):
            raise CalculatorError("math", "a negative number to a fractional power is not a real number")
        if base == 0:
            if exponent < 0:
                raise CalculatorError("math", "zero to a negative power")
            return sympy.Integer(0) if exponent > 0 else sympy.Integer(1)
        # Numeric: bound the result's size from logarithms before computing it.
        magnitude = float(self.mp(exponent)) * float(self.ctx.log10(abs(self.mp(base))))
        if magnitude > lim.max_digits:
            raise CalculatorError("limit", f"the power is beyond 10**{lim.max_digits}")
        return self.from_mp(self.ctx.power(self.mp(base), self.mp(exponent)))

    def exact_root(self, x: sympy.Rational, q: int) -> sympy.Rational | None:
        """``x ** (1/q)`` when it is rational (``sqrt(16/9)`` is ``4/3``), else ``None``."""
        if q > self.limits.max_exponent:
            return None
        p_root, p_exact = sympy.integer_nthroot(int(x.p), q)
        q_root, q_exact = sympy.integer_nthroot(int(x.q), q)
        return sympy.Rational(p_root, q_root) if p_exact and q_exact else None

    def floor(self, x: Number) -> Number:
        if isinstance(x, sympy.Rational):
            return sympy.Integer(x.p // x.q)
        return sympy.Integer(int(self.ctx.floor(self.mp(x))))

    def ceil(self, x: Number) -> Number:
        return -self.floor(-x)

    def round(self, x: Number, ndigits: Number | None = None) -> Number:
        """Half away from zero, as people round (Python's ``round`` rounds half to even)."""
        n = 0 if ndigits is None else int(self.integer(ndigits, "round's digits"))
        if abs(n) > self.limits.max_digits:
            raise CalculatorError("limit", f"cannot round to {n} digits")
        scale = sympy.Integer(10) ** n if n >= 0 else sympy.Rational(1, 10**-n)
        exact = x if isinstance(x, sympy.Rational) else sympy.Rational(str(self.to_float(x)))
        scaled = abs(exact) * scale
        rounded = self.floor(scaled + sympy.Rational(1, 2)) / scale
        return rounded if exact >= 0 else -rounded

    def integer(self, x: Number, what: str) -> int:
        if not (isinstance(x, sympy.Integer) or (isinstance(x, sympy.Float) and x == int(x))):
            raise CalculatorError("math", f"{what} must be a whole number, got {format_value(x)}")
        return int(x)

    def factorial(self, x: Number) -> Number:
        n = self.integer(x, "factorial's argument")
        if n < 0:
            raise CalculatorError("math", "factorial of a negative number")
        if n > self.limits.max_factorial:
            raise CalculatorError("limit", f"factorial({n}) is too large; the limit is factorial({self.limits.max_factorial})")
        return sympy.Integer(math.factorial(n))

    def gcd(self, *args: Number) -> Number:
        return sympy.Integer(math.gcd(*(self.integer(a, "gcd's arguments") for a in args)))

    def lcm(self, *args: Number) -> Number:
        ints = [self.integer(a, "lcm's arguments") for a in args]
        if sum(_digits(i) for i in ints) > self.limits.max_digits:
            raise CalculatorError("limit", f"lcm() would have more than {self.limits.max_digits} digits")
        return sympy.Integer(math.lcm(*ints))

    def log(self, x: Number, base: Number | None = None) -> Number:
        if x <= 0 or (base is not None and (base <= 0 or base == 1)):
            raise CalculatorError("math", "logarithm of a number that is not positive (or base 0 or 1)")
        value = self.ctx.log(self.mp(x)) if base is None else self.ctx.log(self.mp(x)) / self.ctx.log(self.mp(base))
        if base is not None and isinstance(x, sympy.Rational) and isinstance(base, sympy.Rational):
            k = int(self.ctx.nint(value))  # log10(1000) is exactly 3, not 2.9999...
            if abs(k) <= self.limits.max_exponent and abs(value - k) < 1e-9 and self.power(base, sympy.Integer(k)) == x:
                return sympy.Integer(k)
        return self.from_mp(value)

    def transcendental(self, name: str, x: Number) -> Number:
        arg = self.mp(x)
        if name == "exp" and arg > self.limits.max_digits * 2.31:
            raise CalculatorError("limit", f"exp() is beyond 10**{self.limits.max_digits}")
        if name in ("sin", "cos", "tan") and abs(arg) > 1e15:
            raise CalculatorError("limit", f"{name}() of a number beyond 1e15 has no meaningful digits")
        if name in ("asin", "acos") and abs(arg) > 1:
            raise CalculatorError("math", f"{name}() is defined on [-1, 1] only")
        return self.from_mp(getattr(self.ctx, name)(arg))


def _unary(method: str) -> Callable[..., Number]:
    return lambda ev, x: getattr(ev, method)(x)


def _function(name: str) -> Callable[..., Number]:
    return lambda ev, x: ev.transcendental(name, x)


_BINARY: dict[type, Callable[[_Evaluator, Number, Number], Number]] = {
    ast.Add: _Evaluator.add,
    ast.Sub: _Evaluator.sub,
    ast.Mult: _Evaluator.mul,
    ast.Div: _Evaluator.div,
    ast.FloorDiv: _Evaluator.floordiv,
    ast.Mod: _Evaluator.mod,
    ast.Pow: _Evaluator.power,
}

#: Function name -> (fewest arguments, most arguments, implementation).
FUNCTIONS: dict[str, tuple[int, int, Callable[..., Number]]] = {
    "sqrt": (1, 1, lambda ev, x: ev.power(x, sympy.Rational(1, 2))),
    "abs": (1, 1, lambda ev, x: abs(x)),
    "round": (1, 2, _Evaluator.round),
    "floor": (1, 1, _unary("floor")),
    "ceil": (1, 1, _unary("ceil")),
    "exp": (1, 1, _function("exp")),
    "log": (1, 2, _Evaluator.log),
    "ln": (1, 1, _Evaluator.log),
    "log10": (1, 1, lambda ev, x: ev.log(x, sympy.Integer(10))),
    "log2": (1, 1, lambda ev, x: ev.log(x, sympy.Integer(2))),
    "sin": (1, 1, _function("sin")),
    "cos": (1, 1, _function("cos")),
    "tan": (1, 1, _function("tan")),
    "asin": (1, 1, _function("asin")),
    "acos": (1, 1, _function("acos")),
    "atan": (1, 1, _function("atan")),
    "factorial": (1, 1, _Evaluator.factorial),
    "gcd": (2, 10, _Evaluator.gcd),
    "lcm": (2, 10, _Evaluator.lcm),
    "min": (1, 10, lambda ev, *xs: min(xs)),
    "max": (1, 10, lambda ev, *xs: max(xs)),
}

#: Named constants: name -> its value in an mpmath context.
CONSTANTS: dict[str, Callable[[Any], Any]] = {"pi": lambda ctx: +ctx.pi, "e": lambda ctx: +ctx.e}


def _describe(node: ast.AST) -> str:
    kinds = {
        ast.Attribute: "attribute access", ast.Subscript: "subscripting", ast.Lambda: "a lambda",
        ast.Compare: "a comparison", ast.BoolOp: "a boolean operator", ast.Tuple: "a tuple (a stray comma?)",
        ast.List: "a list", ast.Dict: "a dict", ast.Set: "a set", ast.IfExp: "a conditional",
        ast.JoinedStr: "a string", ast.NamedExpr: "an assignment",
    }
    for kind, words in kinds.items():
        if isinstance(node, kind):
            return words
    if isinstance(node, ast.Constant):
        return f"the constant {node.value!r:.40}"
    if isinstance(node, ast.BinOp):
        return f"the operator {type(node.op).__name__}"
    if isinstance(node, ast.UnaryOp):
        return f"the unary operator {type(node.op).__name__}"
    return type(node).__name__


# --------------------------------------------------------------------------- public API


def evaluate(expression: str, limits: CalculatorLimits = DEFAULT_LIMITS) -> sympy.Rational | sympy.Float:
    """The value of ``expression``; raises :class:`CalculatorError` (never anything else for text input)."""
    text = _normalize(expression, limits)
    tree = _parse(text, limits)
    evaluator = _Evaluator(text, limits)
    try:
        return evaluator.value_of(tree)
    except (RecursionError, MemoryError, OverflowError, ZeroDivisionError, ValueError, TypeError) as exc:
        if isinstance(exc, CalculatorError):
            raise
        raise CalculatorError("math", f"cannot compute this ({type(exc).__name__}: {exc})") from None


def format_value(value: sympy.Expr, significant: int = 12) -> str:
    """How a value is shown: ``84``, ``3/4 = 0.75``, ``1/3 ≈ 0.333333333333``, ``1.41421356237``;
    integers of more than 30 digits and other long values in scientific notation."""
    if isinstance(value, sympy.Integer) and _digits(value.p) <= 30:
        return str(int(value))
    if isinstance(value, sympy.Rational):
        decimal = _decimal(value, significant)
        if max(_digits(value.p), _digits(value.q)) > significant:
            return decimal
        return f"{value.p}/{value.q} {'=' if sympy.Rational(decimal) == value else '≈'} {decimal}"
    return _decimal(value, significant)


def _decimal(value: sympy.Expr, significant: int) -> str:
    text = mpmath.nstr(mpmath.mpf(sympy.Float(value, significant + 5)._mpf_), significant, strip_zeros=True)
    return text[:-2] if text.endswith(".0") else text


def calculate(expression: str, limits: CalculatorLimits = DEFAULT_LIMITS) -> CalcResult:
    """Evaluate ``expression`` for an agent: a :class:`CalcResult`, never an exception."""
    try:
        value = evaluate(expression, limits)
    except CalculatorError as exc:
        return CalcResult(expression=str(expression)[:200], value=None, text=f"Error: {exc}", error=exc.kind)
    return CalcResult(expression=expression, value=value, text=format_value(value))
