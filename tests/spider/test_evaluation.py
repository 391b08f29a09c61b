"""Execution accuracy: the official evaluator's verdicts and quirks, and how ``strict`` differs."""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentgym_lightning.envs.spider.evaluation import (
    GoldQueryError,
    SpiderEvaluator,
    official_result_eq,
    strict_result_eq,
)


def both_eq(gold, pred, order_matters):
    cols = len(gold[0]) if gold else 1
    return (
        official_result_eq(gold, pred, order_matters),
        strict_result_eq(gold, pred, order_matters, gold_columns=cols, pred_columns=len(pred[0]) if pred else cols),
    )


# --------------------------------------------------------------------------- result comparison


def test_row_order_matters_only_with_order_by():
    assert both_eq([(1,), (2,)], [(2,), (1,)], order_matters=False) == (True, True)
    assert both_eq([(1,), (2,)], [(2,), (1,)], order_matters=True) == (False, False)


def test_duplicates_count():
    assert both_eq([(1,), (1,), (2,)], [(1,), (2,), (2,)], False) == (False, False)
    assert both_eq([(1,), (1,), (2,)], [(1,), (2,)], False) == (False, False)
    assert both_eq([(1,), (1,), (2,)], [(2,), (1,), (1,)], False) == (True, True)


def test_any_column_permutation():
    gold = [(1, "a", 2.5), (2, "b", 3.5)]
    pred = [("a", 2.5, 1), ("b", 3.5, 2)]
    assert both_eq(gold, pred, False) == (True, True)
    assert both_eq(gold, pred, True) == (True, True)
    # Rows must stay aligned: permuting one column alone is not a column permutation.
    assert both_eq([(1, "a"), (2, "b")], [(1, "b"), (2, "a")], False) == (False, False)


def test_many_columns_permutation():
    rng = random.Random(0)
    gold = [tuple(rng.randrange(3) for _ in range(7)) for _ in range(40)]
    perm = list(range(7))
    rng.shuffle(perm)
    pred = [tuple(r[i] for i in perm) for r in gold]
    rng.shuffle(pred)
    assert both_eq(gold, pred, False) == (True, True)
    # Twelve identical columns: the search must not enumerate 12! permutations.
    wide = [tuple([None] * 12)] * 3
    assert both_eq(wide, list(wide), False) == (True, True)


def test_values_match_exactly():
    assert both_eq([(6,)], [(6.0,)], False) == (True, True)  # 6 == 6.0
    assert both_eq([(6,)], [("6",)], False) == (False, False)  # text never equals a number
    assert both_eq([(0.3,)], [(0.1 + 0.2,)], False) == (False, False)  # no rounding
    assert both_eq([(None,)], [(None,)], False) == (True, True)


def test_official_quick_reject_int_float_artefact():
    # The official quick_rej sorts each row by str(v) + str(type(v)); "6<class 'int'>" and
    # "6.0<class 'float'>" sort differently around "60", so equal rows are rejected there.
    assert official_result_eq([(6, 60)], [(6.0, 60)], False) is False
    assert strict_result_eq([(6, 60)], [(6.0, 60)], False, gold_columns=2, pred_columns=2) is True


def test_empty_results():
    assert official_result_eq([], [], True)
    assert not official_result_eq([], [(1,)], False)
    assert not official_result_eq([(1,)], [], False)
    assert strict_result_eq([], [], False, gold_columns=2, pred_columns=2)
    assert not strict_result_eq([], [], False, gold_columns=2, pred_columns=1)


value = st.one_of(st.integers(-3, 3), st.sampled_from([0.5, 2.0, "a", "b", "6", None]))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_property_permuted_result_matches(data):
    ncol = data.draw(st.integers(1, 5))
    rows = data.draw(st.lists(st.tuples(*[value] * ncol), min_size=1, max_size=8))
    perm = data.draw(st.permutations(range(ncol)))
    pred = [tuple(r[i] for i in perm) for r in rows]
    shuffled = data.draw(st.permutations(pred))
    assert official_result_eq(rows, list(shuffled), False)
    assert strict_result_eq(rows, list(shuffled), False, gold_columns=ncol, pred_columns=ncol)
    assert official_result_eq(rows, pred, True)
    # A value the gold never has breaks the match.
    broken = list(shuffled)
    broken[0] = ("fresh",) + tuple(broken[0][1:])
    assert not official_result_eq(rows, broken, False)
    assert not strict_result_eq(rows, broken, False, gold_columns=ncol, pred_columns=ncol)


# --------------------------------------------------------------------------- quirks on a database


@pytest.fixture(scope="module")
def library(sample_dir: Path) -> Path:
    return sample_dir / "database" / "school_library" / "school_library.sqlite"


def judge(ev: SpiderEvaluator, db: Path, pred, gold) -> tuple[float, float]:
    v = ev.evaluate_all(db, pred, gold)
    return v["official"].score, v["strict"].score


def test_gold_matches_itself(evaluator, library):
    assert judge(evaluator, library, "SELECT title FROM book ORDER BY year", "SELECT title FROM book ORDER BY year") == (1, 1)


def test_order_by_anywhere_in_gold(evaluator, library):
    gold = "SELECT title FROM book ORDER BY year DESC"
    assert judge(evaluator, library, "SELECT title FROM book", gold) == (0, 0)
    assert judge(evaluator, library, "SELECT title FROM book ORDER BY year", "SELECT title FROM book") == (1, 1)
    # An ORDER BY inside a subquery of the gold makes the outer row order count.
    sub = "SELECT title FROM (SELECT title, year FROM book ORDER BY year)"
    assert judge(evaluator, library, "SELECT title FROM book ORDER BY year DESC", sub) == (0, 0)


def test_duplicates_and_column_order(evaluator, library):
    gold = "SELECT genre FROM book"
    assert judge(evaluator, library, "SELECT genre FROM book UNION SELECT genre FROM book", gold) == (0, 0)
    assert judge(evaluator, library, "SELECT year, title FROM book", "SELECT title, year FROM book") == (1, 1)


def test_quirk_distinct_removed_everywhere(evaluator, library):
    # official: DISTINCT is dropped from both queries, even inside COUNT(DISTINCT x).
    assert judge(evaluator, library, "SELECT country FROM author", "SELECT DISTINCT country FROM author") == (1, 0)
    assert judge(evaluator, library, "SELECT DISTINCT genre FROM book", "SELECT genre FROM book") == (1, 0)
    gold = "SELECT count(DISTINCT member_id) FROM loan WHERE returned = 0"
    assert judge(evaluator, library, "SELECT count(member_id) FROM loan WHERE returned = 0", gold) == (1, 0)


def test_quirk_only_first_statement_runs(evaluator, library):
    gold = "SELECT count(*) FROM book"
    assert judge(evaluator, library, "SELECT count(*) FROM book; SELECT 1", gold) == (1, 0)
    assert judge(evaluator, library, "SELECT count(*) FROM book; DROP TABLE book", gold) == (1, 0)
    v = evaluator.evaluate(library, "SELECT count(*) FROM book; SELECT 1", gold, "strict")
    assert v.reason == "pred_multiple_statements"
    assert judge(evaluator, library, "SELECT count(*) FROM book;", gold) == (1, 1)  # one statement


def test_quirk_split_comparisons_joined(evaluator, library):
    gold = "SELECT title FROM book WHERE pages >= 300"
    assert judge(evaluator, library, "SELECT title FROM book WHERE pages > = 300", gold) == (1, 1)
    assert judge(evaluator, library, "SELECT title FROM book WHERE pages ! = 300", "SELECT title FROM book WHERE pages != 300") == (1, 1)


def test_quirk_empty_gold_matches_any_empty_result(evaluator, library):
    gold = "SELECT name FROM author WHERE birth_year > 2000"  # no rows
    assert judge(evaluator, library, "SELECT title, year FROM book WHERE year > 3000", gold) == (1, 0)
    assert judge(evaluator, library, "SELECT 1 WHERE 0", gold) == (1, 0)
    assert judge(evaluator, library, "SELECT title FROM book WHERE year > 3000", gold) == (1, 1)  # same width
    assert evaluator.evaluate(library, "SELECT a, b FROM (SELECT 1 a, 2 b) WHERE 0", gold, "strict").score == 0


def test_quirk_constant_answer(evaluator, library):
    gold = "SELECT count(*) FROM book"  # 9
    assert judge(evaluator, library, "SELECT 9", gold) == (1, 0)
    assert evaluator.evaluate(library, "SELECT 9", gold, "strict").reason == "reads_no_table"
    # A CTE named like a table is not the table.
    assert judge(evaluator, library, "WITH book AS (SELECT 9 AS n) SELECT n FROM book", gold) == (1, 0)
    assert judge(evaluator, library, "SELECT count(*) * 1.0 FROM book", gold) == (1, 1)  # 9 == 9.0
    assert judge(evaluator, library, "SELECT '9' FROM book LIMIT 1", gold) == (0, 0)


@pytest.mark.parametrize("pred", ["", "   ", None])
def test_empty_prediction_scores_zero(evaluator, library, pred):
    v = evaluator.evaluate_all(library, pred, "SELECT count(*) FROM book")
    assert (v["official"].score, v["strict"].score) == (0, 0)
    assert v["official"].reason == v["strict"].reason == "empty_prediction"


def test_errors_score_zero(evaluator, library):
    gold = "SELECT name FROM author WHERE birth_year > 2000"  # empty: an error must still be 0
    for pred in ["SELECT nope FROM author", "SELEC name FROM author", "DELETE FROM author"]:
        assert judge(evaluator, library, pred, gold) == (0, 0)


def test_cur_year_replaced(evaluator, library):
    gold = "SELECT count(*) FROM author WHERE birth_year < 2020"
    assert judge(evaluator, library, "SELECT count(*) FROM author WHERE birth_year < YEAR(CURDATE())", gold) == (1, 1)


def test_failing_gold_is_not_the_policy_fault(evaluator, library):
    with pytest.raises(GoldQueryError):
        evaluator.evaluate(library, "SELECT 1", "SELECT nope FROM nowhere", "official")
    with pytest.raises(ValueError, match="unknown reward variant"):
        evaluator.evaluate(library, "SELECT 1", "SELECT 1", "lenient")  # type: ignore[arg-type]


def test_gold_results_are_cached(library):
    ev = SpiderEvaluator()
    calls = []
    run = ev.sandbox.run
    ev.sandbox.run = lambda *a, **k: calls.append(a[1]) or run(*a, **k)  # type: ignore[method-assign]
    for _ in range(3):
        ev.evaluate_all(library, "SELECT title FROM book", "SELECT title FROM book WHERE genre = 'crime'")
    golds = [sql for sql in calls if "crime" in sql]
    # Both variants run the same text here (no DISTINCT, no ';'): one run in all, not one per call.
    assert len(golds) == 1
    ev.close()


# --------------------------------------------------------------------------- real Spider dev


def _dev(spider_dir: Path):
    from agentgym_lightning.envs.spider.data import SpiderDataWarning, load_spider

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SpiderDataWarning)  # wta_1 is missing, by design
        return load_spider("dev", spider_dir).examples


@pytest.mark.spider
def test_known_wrong_variants_score_zero(spider_dir, evaluator):
    """Over every usable dev question: an empty, a wider and a failing variant of the gold."""
    checked = 0
    for ex in _dev(spider_dir):
        gold = ex.query.strip().rstrip(";")
        if not evaluator.gold_result(ex.db_path, gold).rows:
            continue  # any empty result matches an empty gold in `official`
        wrong = [
            f"SELECT * FROM ({gold}) LIMIT 0",  # no rows
            f"SELECT *, 1 FROM ({gold})",  # one more column
            f"SELECT no_such_column_xyz FROM ({gold})",  # fails to run
        ]
        for pred in wrong:
            v = evaluator.evaluate_all(ex.db_path, pred, gold)
            assert v["official"].score == 0 and v["strict"].score == 0, (ex.id, pred, v)
        checked += 1
    assert checked > 900


@pytest.mark.spider
def test_dev_questions_loaded(spider_dir):
    data = json.loads((spider_dir / "dev.json").read_text())
    assert len(data) == 1034
    assert len(_dev(spider_dir)) == 972
