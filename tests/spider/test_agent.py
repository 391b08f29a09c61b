"""The agent's pieces: verdict parsing, SQL status, result text, schema text; and standalone use."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from agentgym_lightning.envs.spider.agent import SpiderAgent, SpiderAgentConfig, classify_sql, format_result, parse_verdict
from agentgym_lightning.envs.spider.sandbox import ExecResult, SQLSandbox
from agentgym_lightning.envs.spider.schema import describe_database


@pytest.mark.parametrize(
    ("text", "correct"),
    [
        ("Looks fine.\nVERDICT: CORRECT", True),
        ("VERDICT: INCORRECT", False),
        ("verdict - **incorrect**", False),
        ("VERDICT: INCORRECT ... on second thought VERDICT: CORRECT", True),  # the last one decides
        ("The join is wrong.", False),
        ("The query is correct.", True),
        ("", True),
    ],
)
def test_parse_verdict(text, correct):
    assert parse_verdict(text) is correct


def test_classify_sql():
    ok = ExecResult(rows=[(1,)], num_columns=1)
    failed = ExecResult(rows=None, error="error", message="no such column")
    assert classify_sql(None, None) == "no_sql"
    assert classify_sql("SELECT 1", ok) == "executes"
    assert classify_sql("SELECT nope FROM t", failed) == "exec_error"
    assert classify_sql("SELEC name FRM t WHERE", failed) == "parse_error"
    assert classify_sql("SELECT (1", failed) == "parse_error"
    assert classify_sql("x" * 200_000, failed) == "parse_error"


def test_format_result():
    res = ExecResult(rows=[(i, None) for i in range(12)], num_columns=2, column_names=("a", "b"))
    text = format_result(res, max_rows=3)
    assert text.startswith("12 rows:\na | b\n0 | NULL") and "(12 rows in all)" in text
    assert format_result(ExecResult(rows=[], num_columns=1, column_names=("a",))) == "no rows (columns: a)"
    assert format_result(ExecResult(rows=None, error="timeout", message="slow")) == "ERROR (timeout): slow"


@pytest.mark.spider
@pytest.mark.parametrize("budget", [4000, 1200, 300])
def test_schema_fits_its_budget_on_every_database(spider_dir: Path, budget):
    for db in sorted((spider_dir / "database").glob("*/*.sqlite")):
        text = describe_database(db, max_chars=budget)
        assert 0 < len(text) <= budget, db.name
        if budget >= 1200:
            assert "CREATE TABLE" in text or "(" in text


def test_schema_degrades_in_steps(sample_dir: Path):
    db = sample_dir / "database" / "school_library" / "school_library.sqlite"
    full = describe_database(db)
    assert "CREATE TABLE book" in full and "3 example rows of book" in full
    compact = describe_database(db, max_chars=500)
    assert "CREATE TABLE" not in compact and "book(" in compact and "author_id -> author.author_id" in compact
    tiny = describe_database(db, max_chars=120)
    assert len(tiny) <= 120


class FakeClient:
    """An ``openai.OpenAI`` stand-in: answers from a list, records the requests."""

    def __init__(self, answers: list[str]) -> None:
        self.answers = list(answers)
        self.requests: list[dict] = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    def _create(self, **kwargs):
        self.requests.append(kwargs)
        message = SimpleNamespace(content=self.answers.pop(0))
        return SimpleNamespace(choices=[SimpleNamespace(message=message)])


def test_agent_runs_outside_an_env(sample_dir: Path):
    db = sample_dir / "database" / "school_library" / "school_library.sqlite"
    client = FakeClient(["```sql\nSELECT count(*) FROM books\n```", "```sql\nSELECT count(*) FROM book\n```", "VERDICT: CORRECT"])
    emitted: list[tuple[str, object]] = []
    agent = SpiderAgent(SpiderAgentConfig(max_turns=3, max_tokens=64, temperature=0.0), SQLSandbox())
    sql = agent.run({"question": "How many books?", "db_path": str(db)}, client, "m", emit=lambda k, v: emitted.append((k, v)))
    assert sql == "SELECT count(*) FROM book"
    assert [r["metadata"]["role"] for r in client.requests] == ["writer", "rewriter", "checker"]
    assert client.requests[2]["metadata"]["trainable"] == "false"
    assert all(r["max_tokens"] == 64 and r["temperature"] == 0.0 for r in client.requests)
    assert ("sql_status", "exec_error") in emitted and ("sql_status", "executes") in emitted
    with pytest.raises(ValueError, match="max_turns"):
        SpiderAgentConfig(max_turns=0)


def test_writer_system_fills_the_schema_or_appends_it():
    from agentgym_lightning.envs.spider.agent import WRITER_SYSTEM, writer_system

    schema = "CREATE TABLE t (a INT)"
    assert writer_system(WRITER_SYSTEM, schema) == WRITER_SYSTEM.format(schema=schema)  # the default, as before
    assert writer_system("Use {schema} and {this}", schema) == f"Use {schema} and {{this}}"  # other braces are text
    assert writer_system("Write SQL.", schema) == f"Write SQL.\n\nDatabase schema:\n{schema}"  # never without the schema
