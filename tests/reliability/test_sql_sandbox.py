"""Model-written SQL that tries to exhaust memory or time: it fails fast, alone, and bounded.

Peak RSS is this process's (``ru_maxrss``): queries run in worker processes, so a bomb must not
raise it; before the fix ``zeroblob(9999999) x 400`` alone took it to 3.9 GB.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from agentgym_lightning.envs.spider.sandbox import SandboxLimits, SQLSandbox

TIMEOUT = 1.0
MARGIN = 0.25  # SandboxLimits.kill_margin_s
SLACK = 1.0  # scheduling on a loaded machine; far below what a bomb used to add (5.8 s, 16 s)

COLUMNS_2000 = "SELECT " + ", ".join(["zeroblob(9999999)"] * 2000) + " FROM t LIMIT 1"
ROW_OF_100_MB = "SELECT " + ", ".join(["zeroblob(999999)"] * 100) + " FROM t LIMIT 400"

BOMBS = {
    # value past SQLITE_LIMIT_LENGTH, 400 times: 3.9 GB before
    "SELECT zeroblob(9999999) FROM t LIMIT 400": "too_large",
    "SELECT randomblob(9999999) FROM t LIMIT 100": "too_large",
    # 2,000 columns of 10 MB: ~20 GB before; past SQLITE_LIMIT_COLUMN now
    COLUMNS_2000: "too_large",
    # values under the cap, 400 MB in all: stopped by the result cap while fetching
    "SELECT zeroblob(999999) FROM t LIMIT 400": "too_large",
    # rows of 100 MB: the worker holds one, the caller none
    ROW_OF_100_MB: "too_large",
    # one SQLite C call that never checks the clock: 5.8 s past a 5 s limit before
    "SELECT printf('%.*c', 1e9, 'x')": "timeout",
    # LIKE past SQLITE_LIMIT_LIKE_PATTERN_LENGTH
    "SELECT printf('%.500000c', 'a') LIKE '%' || printf('%.49000c', 'a') || 'b'": "too_large",
}


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "t.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (x INTEGER, name TEXT)")
    conn.executemany("INSERT INTO t VALUES (?, ?)", [(i, f"name {i}") for i in range(500)])
    conn.commit()
    conn.close()
    return path


def test_bombs_fail_within_the_limits_and_leave_the_caller_bounded(db: Path, resources):
    before = resources.snapshot()
    peak_before = resources.peak_rss_mb()
    with SQLSandbox(SandboxLimits(timeout_s=TIMEOUT)) as sandbox:
        assert sandbox.run(db, "SELECT count(*) FROM t").rows == [(500,)]
        for sql, expected in BOMBS.items():
            start = time.monotonic()
            result = sandbox.run(db, sql)
            elapsed = time.monotonic() - start
            assert result.error == expected, (sql[:60], result.error, result.message)
            assert elapsed < TIMEOUT + MARGIN + SLACK, (sql[:60], elapsed)
            assert result.message  # says which limit
        # The sandbox still answers, and legit queries are untouched.
        assert sandbox.run(db, "SELECT name FROM t WHERE x = 7").rows == [("name 7",)]
    grown = resources.peak_rss_mb() - peak_before
    assert grown < 100, f"peak RSS grew by {grown:.0f} MiB running SQL bombs"
    resources.assert_no_leaks(before)  # workers ended, their pipes closed


def test_a_result_is_refused_while_it_is_fetched_not_after(db: Path):
    limits = SandboxLimits(max_result_bytes=5_000)
    with SQLSandbox(limits) as sandbox:
        small = sandbox.run(db, "SELECT x FROM t LIMIT 10")
        assert small.ok and 0 < small.result_bytes < 5_000
        big = sandbox.run(db, "SELECT x, name FROM t")
        assert big.error == "too_large" and "5000 bytes" in big.message


def test_sqlite_limits_are_set_on_the_connection(db: Path):
    limits = SandboxLimits(max_value_bytes=1_000, max_columns=3)
    with SQLSandbox(limits) as sandbox:
        assert sandbox.run(db, "SELECT length(zeroblob(1000))").rows == [(1000,)]
        assert sandbox.run(db, "SELECT zeroblob(1001)").error == "too_large"
        assert sandbox.run(db, "SELECT 1, 2, 3").ok
        assert sandbox.run(db, "SELECT 1, 2, 3, 4").error == "too_large"


def test_a_killed_worker_is_replaced_and_concurrent_queries_each_finish(db: Path):
    import threading

    with SQLSandbox(SandboxLimits(timeout_s=TIMEOUT), max_workers=2) as sandbox:
        results: dict[str, str | None] = {}

        def run(name: str, sql: str) -> None:
            results[name] = sandbox.run(db, sql).error

        threads = [threading.Thread(target=run, args=(f"bomb{i}", "SELECT printf('%.*c', 1e9, 'x')")) for i in range(2)]
        threads += [threading.Thread(target=run, args=(f"ok{i}", "SELECT count(*) FROM t")) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert results == {"bomb0": "timeout", "bomb1": "timeout", **{f"ok{i}": None for i in range(4)}}
        assert sandbox.run(db, "SELECT 1").rows == [(1,)]


def test_temp_storage_of_a_query_is_capped_in_memory_not_spilled_to_disk(db: Path):
    # Before: temp files on disk without bound (one ORDER BY over a cross join of Spider's sakila_1
    # held 216 MB of them within its 5 s: bench command in docs/limits.md); the sort here finished
    # and failed later, on its 250,000 rows.
    cross_sort = "SELECT a.name || b.name AS s FROM t a, t b ORDER BY s"
    with SQLSandbox(SandboxLimits(max_temp_bytes=4_000_000, max_rows=10)) as sandbox:
        result = sandbox.run(db, cross_sort)
        assert result.error == "too_large" and "4000000 bytes of SQLite memory and temp storage" in result.message
        assert sandbox.run(db, "SELECT name FROM t ORDER BY name DESC LIMIT 2").rows == [("name 99",), ("name 98",)]
