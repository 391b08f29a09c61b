"""The official evaluator's text rewrites (sqlparse semantics, reimplemented) and SQL extraction."""

from __future__ import annotations

import pytest

from agentgym_lightning.envs.spider.sqltext import (
    extract_sql,
    has_order_by,
    join_split_comparisons,
    official_normalize,
    replace_cur_year,
)


def test_postprocess_joins_split_comparisons_everywhere():
    assert join_split_comparisons("a > = 1 AND b < = 2 AND c ! = 3") == "a >= 1 AND b <= 2 AND c != 3"
    # A plain text replace, as the official code does: string literals too.
    assert join_split_comparisons("x = '> ='") == "x = '>='"


def test_replace_cur_year():
    assert replace_cur_year("SELECT YEAR ( CURDATE ( ) ) - born FROM t") == "SELECT 2020- born FROM t"


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT DISTINCT name FROM t", "SELECT  name FROM t"),
        ("select count(distinct x) from t", "select count( x) from t"),  # even inside COUNT
        ("SELECT count(DISTINCT(x)) FROM t", "SELECT count((x)) FROM t"),
        ("SELECT t.distinct FROM t", "SELECT t. FROM t"),  # any bare token, names too
        ("SELECT 'distinct' FROM t", "SELECT 'distinct' FROM t"),  # not in strings
        ('SELECT "distinct", `distinct`, [distinct] FROM t', 'SELECT "distinct", `distinct`, [distinct] FROM t'),
        ("SELECT a FROM t -- distinct", "SELECT a FROM t -- distinct"),  # not in comments
        ("SELECT distinct_x, xdistinct FROM t", "SELECT distinct_x, xdistinct FROM t"),  # not in words
    ],
)
def test_official_distinct_removal(sql, expected):
    assert official_normalize(sql) == expected


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT 1; DROP TABLE t", "SELECT 1; "),  # only the first statement survives
        ("SELECT 1;\nSELECT 2", "SELECT 1;"),
        ("SELECT 1; -- note\nSELECT 2", "SELECT 1; -- note\n"),  # sqlparse keeps a trailing comment
        ("SELECT ';' FROM t; x", "SELECT ';' FROM t; "),  # ';' in a string does not split
        ("SELECT (1; 2); 3", "SELECT (1; 2); "),  # nor inside parentheses
        ("SELECT CASE WHEN a THEN b END; x", "SELECT CASE WHEN a THEN b END; "),
        ("  ;SELECT 1", "  ;"),  # an empty first statement is still a statement
        ("SELECT 1", "SELECT 1"),
    ],
)
def test_official_first_statement(sql, expected):
    assert official_normalize(sql) == expected


@pytest.mark.parametrize("sql", ["", "   ", "\n\t "])
def test_official_no_statement(sql):
    # The official code crashes here (sqlparse.parse(s)[0] of nothing): callers score 0.
    assert official_normalize(sql) is None


def test_order_by_rule_is_textual():
    assert has_order_by("SELECT a FROM t ORDER BY a")
    assert has_order_by("SELECT a FROM (SELECT a FROM t ORDER BY a LIMIT 3)")  # subqueries count
    assert not has_order_by("SELECT a FROM t ORDER  BY a")  # exactly one space, as official


@pytest.mark.parametrize(
    ("completion", "sql"),
    [
        ("```sql\nSELECT a FROM t;\n```", "SELECT a FROM t"),
        ("Here you go:\n```SQL\nSELECT a\nFROM t\nWHERE b = 1\n```\nThis selects a.", "SELECT a\nFROM t\nWHERE b = 1"),
        ("```\nSELECT 1\n```\nBetter:\n```sql\nSELECT 2\n```", "SELECT 2"),  # the last answer wins
        # a later labelled fragment is not a revision: the last whole query wins (seen in training)
        ("```sql\nSELECT *FROM member\n```\nThen:\n```sql\nFROM member\n```\n```sql\n```", "SELECT *FROM member"),
        ("```sql\nPRAGMA table_info(t)\n```", "PRAGMA table_info(t)"),  # no block reads as a query: the last labelled one
        ("```sql\nSELECT a FROM t WHERE", "SELECT a FROM t WHERE"),  # unclosed fence (cut off)
        ("SELECT name FROM singer WHERE age > 20;", "SELECT name FROM singer WHERE age > 20"),
        ("The answer is SELECT a FROM t WHERE b IN (SELECT b FROM u)", "SELECT a FROM t WHERE b IN (SELECT b FROM u)"),
        ("Query: SELECT x FROM y\n\nThis query returns x.", "SELECT x FROM y"),
        ("SQL: `SELECT x FROM y`", "SELECT x FROM y"),
        ("WITH c AS (SELECT 1) SELECT * FROM c", "WITH c AS (SELECT 1) SELECT * FROM c"),
        ("<think>maybe SELECT bad</think>\nSELECT good FROM t", "SELECT good FROM t"),
        ("SELECT a FROM t\nThis query lists a.", "SELECT a FROM t"),
    ],
)
def test_extract_sql(completion, sql):
    assert extract_sql(completion) == sql


@pytest.mark.parametrize(
    "completion",
    [None, "", "I don't know.", "```python\nprint(1)\n```", "```sql\n;\n```", "Use a SELECT statement: it reads rows."],
)
def test_extract_sql_none(completion):
    assert extract_sql(completion) is None


def test_extract_sql_is_fast_on_huge_text():
    import time

    text = "SELECT 1 " * 100_000
    start = time.monotonic()
    extract_sql(text)
    official_normalize(text)
    assert time.monotonic() - start < 5.0
