"""Hostile SQL: it scores 0 within the time limit and no database file changes."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pytest

from agentgym_lightning.envs.spider.sandbox import SandboxLimits, SQLSandbox

TIMEOUT = 0.5

HOSTILE = [
    "DROP TABLE singer",
    "DELETE FROM singer",
    "UPDATE singer SET Age = 0",
    "INSERT INTO singer (Singer_ID) VALUES (99)",
    "CREATE TABLE evil (x)",
    "CREATE TEMP TABLE evil AS SELECT * FROM singer",
    "ATTACH DATABASE '{tmp}/evil.db' AS evil",
    "PRAGMA writable_schema = 1",
    "PRAGMA writable_schema",
    "PRAGMA journal_mode = WAL",
    "PRAGMA user_version = 7",
    "PRAGMA query_only = 0",
    "VACUUM",
    "VACUUM INTO '{tmp}/copy.db'",
    "REINDEX",
    "ANALYZE",
    "BEGIN IMMEDIATE",
    "SELECT load_extension('{tmp}/evil.so')",
    # Never ends: a recursive CTE without a bound.
    "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT count(*) FROM r",
    # Huge cartesian joins: one that aggregates (time limit), one that returns rows (row cap).
    "SELECT count(*) FROM " + ", ".join(f"singer t{i}" for i in range(12)),
    "SELECT * FROM " + ", ".join(f"singer t{i}" for i in range(9)),
    "SELECT randomblob(2000000000)",
    # 1 MB of SQL.
    "SELECT " + "1 + " * 262_144 + "1",
]


@pytest.fixture
def spider_copy(spider_dir: Path, tmp_path: Path, copy_writable) -> Path:
    """A writable Spider folder with one database (concert_singer) and one question."""
    root = tmp_path / "spider"
    (root / "database").mkdir(parents=True)
    copy_writable(spider_dir / "database" / "concert_singer", root / "database" / "concert_singer")
    question = {"db_id": "concert_singer", "question": "How many singers do we have?", "query": "SELECT count(*) FROM singer"}
    (root / "dev.json").write_text(json.dumps([question]))
    shutil.copy(spider_dir / "tables.json", root / "tables.json")
    return root


def _hostile(tmp: Path) -> list[str]:
    return [q.replace("{tmp}", str(tmp)) for q in HOSTILE]


@pytest.mark.spider
def test_hostile_sql_in_the_sandbox(spider_copy: Path, tmp_path: Path, tree_hash):
    db = spider_copy / "database" / "concert_singer" / "concert_singer.sqlite"
    before = tree_hash(spider_copy)
    with SQLSandbox(SandboxLimits(timeout_s=TIMEOUT, max_rows=10_000)) as sandbox:
        for sql in _hostile(tmp_path):
            start = time.monotonic()
            result = sandbox.run(db, sql)
            elapsed = time.monotonic() - start
            assert not result.ok, sql[:80]
            assert elapsed < TIMEOUT + 1.0, (sql[:80], elapsed)
        # Reads still work afterwards.
        assert sandbox.run(db, "SELECT count(*) FROM singer").rows == [(6,)]
    assert tree_hash(spider_copy) == before
    assert not (tmp_path / "evil.db").exists() and not (tmp_path / "copy.db").exists()


@pytest.mark.spider
def test_hostile_sql_through_the_env(spider_copy: Path, tmp_path: Path, tree_hash):
    from agentgym_lightning.envs.spider.env import make_env

    before = tree_hash(spider_copy)
    env = make_env(data_dir=str(spider_copy), max_turns=1, sql_timeout_s=TIMEOUT, max_rows=10_000)
    try:
        for sql in _hostile(tmp_path):
            start = time.monotonic()
            env.reset(options={"task_index": 0})
            _, reward, terminated, truncated, info = env.step(f"```sql\n{sql}\n```")
            elapsed = time.monotonic() - start
            assert terminated and not truncated, info["error"]
            assert reward == 0.0, sql[:80]
            assert info["trajectory"].variables["metrics"] == {"strict": 0.0, "official": 0.0}, sql[:80]
            # One run: the agent's run of its query is the judged one, and a query that exhausts
            # a limit is not run again in another normalization.
            assert elapsed < TIMEOUT + 2.0, (sql[:80], elapsed)
        # The official quirk runs only the first statement: it scores, and still changes nothing.
        env.reset(options={"task_index": 0})
        _, _, _, _, info = env.step("```sql\nSELECT count(*) FROM singer; DROP TABLE singer\n```")
        assert info["trajectory"].variables["metrics"] == {"strict": 0.0, "official": 1.0}
    finally:
        env.close()
    assert tree_hash(spider_copy) == before
    assert not (tmp_path / "evil.db").exists()


def test_cancel_interrupts_a_running_query(sample_dir: Path):
    db = sample_dir / "database" / "school_library" / "school_library.sqlite"
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    with SQLSandbox(SandboxLimits(timeout_s=30)) as sandbox:
        start = time.monotonic()
        result = sandbox.run(db, "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT count(*) FROM r", cancel=cancel)
    assert result.error == "cancelled"
    assert time.monotonic() - start < 5


def test_invalid_utf8_text_is_decoded_like_the_official_evaluator(tmp_path: Path):
    import sqlite3

    db = tmp_path / "latin1.sqlite"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE t (name TEXT)")
    conn.execute("INSERT INTO t VALUES (CAST(X'436166E9' AS TEXT))")  # 'Café' in latin-1
    conn.commit()
    conn.close()
    with SQLSandbox() as sandbox:
        assert sandbox.run(db, "SELECT name FROM t").rows == [("Caf",)]  # bad bytes dropped


def test_missing_database_is_an_error(tmp_path: Path):
    with SQLSandbox() as sandbox, pytest.raises(FileNotFoundError):
        sandbox.run(tmp_path / "nope.sqlite", "SELECT 1")
