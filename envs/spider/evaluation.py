"""Execution accuracy on Spider, in two named variants: ``official`` and ``strict``.

``official`` reproduces the verdicts of Spider's official test-suite evaluator
(taoyds/test-suite-sql-eval, ``exec_eval.eval_exec_match`` with its defaults ``plug_value=False,
keep_distinct=False`` on one database file). This is an independent implementation of the
behaviour described there; each rule below names what it reproduces:

* both queries go through ``postprocess`` (``"> ="`` -> ``">="`` etc.) and ``remove_distinct``
  (every bare ``distinct`` token removed, even in ``COUNT(DISTINCT x)``; only the first statement
  kept, because the official code takes ``sqlparse.parse(s)[0]``) -- see :mod:`.sqltext`;
* ``YEAR(CURDATE())`` is replaced by ``2020`` before executing (``replace_cur_year``);
* rows are compared in order iff the normalized gold text contains ``order by``
  (``order_matters = 'order by' in g_str.lower()``, subqueries and literals included);
  otherwise as multisets (duplicates count);
* ``result_eq``: two empty results match (so any prediction that runs and returns no rows
  matches an empty gold result, whatever its columns); different row or column counts never
  match; the official ``quick_rej`` pre-check sorts each row's values by ``str(v) + str(type(v))``
  and compares those (a set of them when order does not matter), which rejects a few results
  that are equal only across ``int``/``float`` (``(6, 60)`` vs ``(6.0, 60)``); then any column
  permutation is accepted. Values compare with Python ``==`` (``6 == 6.0``, ``'6' != 6``);
* a prediction that raises scores 0; a constant answer (``SELECT 6``) is a normal query;
* the official code crashes on an empty prediction (sqlparse finds no statement); it scores 0.

The official implementation enumerates column permutations (sampling 20 rows to prune them
when there are more than 3 columns); pruning never changes its verdict, so this one searches
permutations deterministically with a complete, faster search and returns the same answers.

Where this module cannot match the official code, it says so and errs on the side of safety:
predictions run in the read-only :mod:`.sandbox` (a write the official code would execute, such as
``CREATE TABLE``, fails here), with a time limit (the official 60 s ``asyncio.wait_for`` never
fires on a synchronous query), a row cap and a result-size cap far above any gold result (so
verdicts are unchanged: a prediction past them cannot equal the gold result). A prediction that
exhausts a limit (time, size, rows) in one variant is scored by that failure in the other without
running again: a hostile query costs its limit once, not once per variant.

``strict`` (the default training reward) is the same comparison without the loopholes an RL
policy would learn: DISTINCT is kept on both sides; the SQL must be exactly one statement (no
first-``;`` truncation: SQLite itself rejects a second one); a query that reads no table of the
database scores 0 (``SELECT 6``); an empty gold result is matched only by an empty result with the
same number of columns. It drops the ``quick_rej`` ``int``/``float`` artefact (a false negative,
not a loophole) and also counts ``ORDER  BY`` written with other blanks as ordering.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .sandbox import RESOURCE_ERRORS, ExecResult, SandboxLimits, SQLSandbox, database_tables
from .sqltext import StatementTooLong, has_order_by, join_split_comparisons, official_normalize, replace_cur_year

__all__ = [
    "VARIANTS",
    "Variant",
    "Verdict",
    "GoldQueryError",
    "SpiderEvaluator",
    "official_result_eq",
    "strict_result_eq",
]

Variant = Literal["official", "strict"]
#: Every reward variant, the default (training) one first.
VARIANTS: tuple[Variant, ...] = ("strict", "official")

Row = tuple[Any, ...]


@dataclass(frozen=True)
class Verdict:
    """One prediction judged by one variant."""

    score: float
    #: ``match``, ``mismatch``, ``empty_prediction``, ``reads_no_table``,
    #: ``empty_gold_columns_differ``, or ``pred_<kind>`` where kind is an
    #: :attr:`ExecResult.error` (``pred_error``, ``pred_timeout``, ``pred_denied``,
    #: ``pred_multiple_statements``, ...).
    reason: str
    detail: str = ""
    #: ``(rows, columns)`` of the prediction's result as this variant ran it (``None`` when it
    #: did not run or failed) and of the gold result, so a ``mismatch`` can be read off a log.
    pred_shape: tuple[int, int] | None = None
    gold_shape: tuple[int, int] | None = None

    @property
    def correct(self) -> bool:
        return self.score > 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "score": self.score,
            "reason": self.reason,
            "detail": self.detail,
            "pred_shape": list(self.pred_shape) if self.pred_shape is not None else None,
            "gold_shape": list(self.gold_shape) if self.gold_shape is not None else None,
        }


class GoldQueryError(RuntimeError):
    """The gold query itself failed: a fault of the data or the machine, never of the policy."""


# --------------------------------------------------------------------------- result comparison


def _official_sort_key(value: Any) -> str:
    return str(value) + str(type(value))


def _official_quick_rej(gold: Sequence[Row], pred: Sequence[Row], order_matters: bool) -> bool:
    """The official ``quick_rej``: rows with their values sorted by ``str(v) + str(type(v))``."""
    s1 = [tuple(sorted(row, key=_official_sort_key)) for row in gold]
    s2 = [tuple(sorted(row, key=_official_sort_key)) for row in pred]
    return s1 == s2 if order_matters else set(s1) == set(s2)


def _project(rows: Sequence[Row], cols: Sequence[int]) -> Counter[Row]:
    return Counter(tuple(row[c] for c in cols) for row in rows)


def _exists_column_permutation(gold: Sequence[Row], pred: Sequence[Row], order_matters: bool) -> bool:
    """Whether some reordering of ``pred``'s columns makes it equal to ``gold``: as lists when
    order matters, as multisets of rows otherwise. Both are non-empty with equal shapes."""
    if order_matters:
        if list(gold) == list(pred):
            return True
        # Rows line up one to one, so a permutation exists iff the columns, as sequences, are
        # the same multiset.
        return Counter(zip(*gold)) == Counter(zip(*pred))
    gold_rows = Counter(gold)
    if gold_rows == Counter(pred):
        return True
    n = len(gold[0])
    if n == 1:
        return False
    gcols = list(zip(*gold))
    pcols = list(zip(*pred))
    gms = [Counter(c) for c in gcols]
    pms = [Counter(c) for c in pcols]
    candidates = [[j for j in range(n) if pms[j] == gms[c]] for c in range(n)]
    if any(not c for c in candidates):
        return False
    # Identical pred columns are interchangeable: try one of each kind at every step.
    kind: list[int] = []
    seen: dict[tuple[Any, ...], int] = {}
    for col in pcols:
        kind.append(seen.setdefault(col, len(seen)))
    order = sorted(range(n), key=lambda c: len(candidates[c]))
    assigned: list[int] = []
    used: set[int] = set()

    def search(k: int) -> bool:
        if k == n:
            return True  # the last partial check compared every column
        c = order[k]
        tried: set[int] = set()
        for j in candidates[c]:
            if j in used or kind[j] in tried:
                continue
            tried.add(kind[j])
            assigned.append(j)
            # Necessary condition: the projections on the columns chosen so far agree.
            if _project(gold, order[: k + 1]) == _project(pred, assigned):
                used.add(j)
                if search(k + 1):
                    return True
                used.discard(j)
            assigned.pop()
        return False

    return search(0)


def _shapes_differ(gold: Sequence[Row], pred: Sequence[Row]) -> bool:
    return len(gold) != len(pred) or len(gold[0]) != len(pred[0])


def official_result_eq(gold: Sequence[Row], pred: Sequence[Row], order_matters: bool) -> bool:
    """The official ``result_eq(gold, pred, order_matters)`` verdict."""
    if not gold and not pred:
        return True
    if not gold or not pred or _shapes_differ(gold, pred):
        return False
    if not _official_quick_rej(gold, pred, order_matters):
        return False
    return _exists_column_permutation(gold, pred, order_matters)


def strict_result_eq(
    gold: Sequence[Row], pred: Sequence[Row], order_matters: bool, *, gold_columns: int, pred_columns: int
) -> bool:
    """Same denotation; two empty results must also have the same number of columns."""
    if not gold and not pred:
        return gold_columns == pred_columns
    if not gold or not pred or _shapes_differ(gold, pred):
        return False
    return _exists_column_permutation(gold, pred, order_matters)


# --------------------------------------------------------------------------- the evaluator

_ORDER_BY_ANY_BLANKS = re.compile(r"\border\s+by\b", re.IGNORECASE)


def _strict_order_matters(gold_sql: str) -> bool:
    return has_order_by(gold_sql) or _ORDER_BY_ANY_BLANKS.search(gold_sql) is not None


def _defines_cte(sql: str, name: str) -> bool:
    # `name AS (` or `name(cols) AS (` only occurs where a CTE is defined.
    pattern = rf"(?<![\w$]){re.escape(name)}(?![\w$])[\"`\]]?\s*(\([^()]*\))?\s*AS\s*(NOT\s+)?(MATERIALIZED\s*)?\("
    return re.search(pattern, sql, re.IGNORECASE) is not None


class SpiderEvaluator:
    """Judges predicted SQL against gold SQL on a database, in either variant.

    Gold results are cached per (database, executed gold text), so a question's gold query runs
    once however many rollouts are judged. Thread-safe.
    """

    def __init__(
        self,
        sandbox: SQLSandbox | None = None,
        *,
        gold_timeout_s: float = 60.0,
        gold_cache_size: int = 100_000,
    ) -> None:
        self.sandbox = sandbox or SQLSandbox(SandboxLimits())
        self.gold_timeout_s = gold_timeout_s
        self._gold_cache: dict[tuple[str, str], ExecResult] = {}
        self._gold_cache_size = gold_cache_size
        self._tables: dict[str, frozenset[str]] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ helpers

    def gold_result(self, db_path: str | Path, sql: str) -> ExecResult:
        """The (cached) result of an already-normalized gold query; raises :class:`GoldQueryError`."""
        key = (str(db_path), sql)
        with self._lock:
            cached = self._gold_cache.get(key)
        if cached is not None:
            return cached
        result = self.sandbox.run(db_path, sql, timeout_s=self.gold_timeout_s)
        if not result.ok:
            raise GoldQueryError(f"the gold query failed on {db_path} ({result.error}: {result.message}): {sql}")
        with self._lock:
            if len(self._gold_cache) >= self._gold_cache_size:
                self._gold_cache.pop(next(iter(self._gold_cache)))  # drop the oldest
            self._gold_cache[key] = result
        return result

    def tables(self, db_path: str | Path) -> frozenset[str]:
        """Lower-cased user tables and views of a database (cached)."""
        key = str(db_path)
        with self._lock:
            found = self._tables.get(key)
        if found is None:
            found = frozenset(t.lower() for t in database_tables(db_path))
            with self._lock:
                self._tables[key] = found
        return found

    def reads_database_table(self, db_path: str | Path, sql: str, result: ExecResult) -> bool:
        """Whether running ``sql`` read at least one table (or view) of the database."""
        tables = self.tables(db_path)
        if result.tables_read & tables:
            return True
        return any(name in tables and not _defines_cte(sql, name) for name in result.tables_scanned)

    # ------------------------------------------------------------------ variants

    def evaluate(
        self,
        db_path: str | Path,
        pred: str | None,
        gold: str,
        variant: Variant = "strict",
        *,
        _runs: dict[str, ExecResult] | None = None,
    ) -> Verdict:
        """Score ``pred`` against ``gold`` (1.0 or 0.0) with the named variant."""
        if variant == "official":
            return self._official(db_path, pred, gold, _runs if _runs is not None else {})
        if variant == "strict":
            return self._strict(db_path, pred, gold, _runs if _runs is not None else {})
        raise ValueError(f"unknown reward variant {variant!r}; choose one of {', '.join(VARIANTS)}")

    def evaluate_all(
        self, db_path: str | Path, pred: str | None, gold: str, *, pred_result: ExecResult | None = None
    ) -> dict[str, Verdict]:
        """Both variants. A prediction that reads the same after normalization runs once, and one
        that exhausted a limit (time, size, rows: :data:`~.sandbox.RESOURCE_ERRORS`) is not run in
        another form: every variant scores it by that failure.

        ``pred_result`` is ``pred`` already run through this evaluator's sandbox (the agent ran
        it): it is reused, so a query runs once per step, not once per variant plus once for the
        agent.
        """
        runs: dict[str, ExecResult] = {}
        if pred_result is not None and pred is not None:
            runs[pred] = pred_result
        return {v: self.evaluate(db_path, pred, gold, v, _runs=runs) for v in VARIANTS}

    def _run_pred(self, db_path: str | Path, sql: str, runs: dict[str, ExecResult]) -> ExecResult:
        if sql in runs:
            return runs[sql]
        exhausted = next((r for r in runs.values() if r.error in RESOURCE_ERRORS), None)
        if exhausted is not None:
            return exhausted  # another form of the same prediction would exhaust it again
        runs[sql] = self.sandbox.run(db_path, sql)
        return runs[sql]

    def _official(self, db_path: str | Path, pred: str | None, gold: str, runs: dict[str, ExecResult]) -> Verdict:
        g_norm = official_normalize(join_split_comparisons(gold))
        if g_norm is None:
            raise GoldQueryError(f"the gold query is empty for {db_path}")
        try:
            # A first statement past twice the sandbox's SQL limit is refused there anyway; stop
            # lexing it early (the official code has no such limit: documented deviation).
            p_norm = official_normalize(
                join_split_comparisons(pred or ""), max_chars=2 * self.sandbox.limits.max_sql_bytes
            )
        except StatementTooLong as exc:
            return Verdict(0.0, "pred_too_long", str(exc))
        if p_norm is None:
            return Verdict(0.0, "empty_prediction")
        gold_res = self.gold_result(db_path, replace_cur_year(g_norm))
        pred_res = self._run_pred(db_path, replace_cur_year(p_norm), runs)
        shapes = {"pred_shape": pred_res.shape, "gold_shape": gold_res.shape}
        if not pred_res.ok:
            return Verdict(0.0, f"pred_{pred_res.error}", pred_res.message, **shapes)
        assert gold_res.rows is not None and pred_res.rows is not None
        if official_result_eq(gold_res.rows, pred_res.rows, has_order_by(g_norm)):
            return Verdict(1.0, "match", **shapes)
        return Verdict(0.0, "mismatch", **shapes)

    def _strict(self, db_path: str | Path, pred: str | None, gold: str, runs: dict[str, ExecResult]) -> Verdict:
        if not gold.strip():
            raise GoldQueryError(f"the gold query is empty for {db_path}")
        if pred is None or not pred.strip():
            return Verdict(0.0, "empty_prediction")
        g_sql = replace_cur_year(join_split_comparisons(gold))
        p_sql = replace_cur_year(join_split_comparisons(pred))
        gold_res = self.gold_result(db_path, g_sql)
        pred_res = self._run_pred(db_path, p_sql, runs)
        shapes = {"pred_shape": pred_res.shape, "gold_shape": gold_res.shape}
        if not pred_res.ok:
            return Verdict(0.0, f"pred_{pred_res.error}", pred_res.message, **shapes)
        assert gold_res.rows is not None and pred_res.rows is not None
        if not self.reads_database_table(db_path, p_sql, pred_res) and self.reads_database_table(
            db_path, g_sql, gold_res
        ):
            return Verdict(0.0, "reads_no_table", "the query reads no table of the database", **shapes)
        if not gold_res.rows and not pred_res.rows and gold_res.num_columns != pred_res.num_columns:
            return Verdict(
                0.0,
                "empty_gold_columns_differ",
                f"both results are empty but have {gold_res.num_columns} vs {pred_res.num_columns} columns",
                **shapes,
            )
        ok = strict_result_eq(
            gold_res.rows,
            pred_res.rows,
            _strict_order_matters(g_sql),
            gold_columns=gold_res.num_columns,
            pred_columns=pred_res.num_columns,
        )
        return Verdict(1.0, "match", **shapes) if ok else Verdict(0.0, "mismatch", **shapes)

    def close(self) -> None:
        self.sandbox.close()
