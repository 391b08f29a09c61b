"""Rules that choose a subset of Spider's questions from the data alone (the env's
``single_table=`` and ``max_tables=``), applied the same way to every split.

A 135M model gets almost no Spider question right; a subset it can learn is chosen by a rule on
the question's gold SQL and its database, never by how a model did on it, so the same rule picks
the training questions (train databases) and the held-out ones (dev databases):

* ``single_table``: the gold query is one ``SELECT`` reading one table (no ``JOIN``, no
  subquery, no ``UNION``/``INTERSECT``/``EXCEPT``), parsed by sqlglot as SQLite.
* ``max_tables``: the database has at most this many tables (as the agent's schema prompt shows
  them: every user table), so the schema is short and has few tables to confuse.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from .schema import read_tables

__all__ = ["reads_one_table", "table_count", "select_tasks"]


@functools.lru_cache(maxsize=None)
def reads_one_table(sql: str) -> bool:
    """Whether ``sql`` is one ``SELECT`` over one table (False for text sqlglot cannot parse)."""
    import sqlglot
    from sqlglot import exp

    try:
        tree = sqlglot.parse_one(sql, read="sqlite")
    except sqlglot.errors.ParseError:
        return False
    selects = list(tree.find_all(exp.Select))
    tables = {t.name.lower() for t in tree.find_all(exp.Table)}
    return isinstance(tree, exp.Select) and len(selects) == 1 and len(tables) == 1


def table_count(db_path: str) -> int:
    """The user tables of a database (those the schema prompt describes)."""
    return len(read_tables(db_path, 0))


def select_tasks(
    tasks: Sequence[Mapping[str, Any]], *, single_table: bool = False, max_tables: int | None = None
) -> list[Mapping[str, Any]]:
    """The tasks that pass the rules (module docstring), in their order."""
    if max_tables is not None and (isinstance(max_tables, bool) or not isinstance(max_tables, int) or max_tables < 1):
        raise ValueError(f"max_tables must be an integer >= 1 or None; got {max_tables!r}")
    out = []
    for task in tasks:
        if single_table and not reads_one_table(task["query"]):
            continue
        if max_tables is not None and table_count(task["db_path"]) > max_tables:
            continue
        out.append(task)
    return out
