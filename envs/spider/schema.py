"""The database schema as the agent's prompt shows it: ``CREATE TABLE`` text plus sample rows.

Read from the database itself (not ``tables.json``), the way text-to-SQL prompts usually show it.
Spider databases range from 2 to 20+ tables, so the text is fitted to a character budget in
steps, each losing less useful detail first: fewer sample rows, then one compact line per table,
then fewer columns per table, then fewer tables (named at the end so the model knows they exist).
"""

from __future__ import annotations

import functools
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["TableInfo", "read_tables", "describe_database"]


@dataclass(frozen=True)
class TableInfo:
    name: str
    ddl: str
    columns: tuple[tuple[str, str], ...]  #: (name, declared type)
    primary_key: tuple[str, ...]
    foreign_keys: tuple[tuple[str, str, str], ...]  #: (column, referenced table, referenced column)
    sample_rows: tuple[tuple[Any, ...], ...]


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@functools.lru_cache(maxsize=512)
def read_tables(db_path: str, max_sample_rows: int = 3) -> tuple[TableInfo, ...]:
    """Every user table of a database, with up to ``max_sample_rows`` rows each (cached)."""
    conn = sqlite3.connect(Path(db_path).resolve().as_uri() + "?mode=ro&immutable=1", uri=True)
    conn.text_factory = lambda b: b.decode(errors="ignore")
    try:
        tables = conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' "
            "ORDER BY rowid"
        ).fetchall()
        out = []
        for name, ddl in tables:
            cols = conn.execute(f"PRAGMA table_info({_quote(name)})").fetchall()
            fks = conn.execute(f"PRAGMA foreign_key_list({_quote(name)})").fetchall()
            try:
                rows = conn.execute(f"SELECT * FROM {_quote(name)} LIMIT {int(max_sample_rows)}").fetchall()
            except sqlite3.DatabaseError:
                rows = []
            out.append(
                TableInfo(
                    name=name,
                    ddl=_tidy_ddl(ddl or ""),
                    columns=tuple((c[1], c[2] or "") for c in cols),
                    primary_key=tuple(c[1] for c in sorted(cols, key=lambda c: c[5]) if c[5]),
                    foreign_keys=tuple((fk[3], fk[2], fk[4] or "") for fk in fks),
                    sample_rows=tuple(rows),
                )
            )
        return tuple(out)
    finally:
        conn.close()


def _tidy_ddl(ddl: str) -> str:
    # Spider's DDL carries comments, tabs and blank lines; none of them help the model.
    ddl = re.sub(r"--[^\n]*", "", ddl)
    lines = [line.rstrip() for line in ddl.replace("\t", "  ").splitlines()]
    return "\n".join(line for line in lines if line.strip())


def _value(v: Any, max_chars: int) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bytes):
        return f"<{len(v)} bytes>"
    text = str(v).replace("\n", " ")
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


def _rows_block(t: TableInfo, n: int, max_value_chars: int) -> str:
    if n <= 0 or not t.sample_rows:
        return ""
    header = " | ".join(c for c, _ in t.columns)
    body = "\n".join(" | ".join(_value(v, max_value_chars) for v in row) for row in t.sample_rows[:n])
    return f"/* {min(n, len(t.sample_rows))} example rows of {t.name}:\n{header}\n{body}\n*/"


def _compact(t: TableInfo, max_columns: int | None = None) -> str:
    cols = [f"{c} {ty}".strip() for c, ty in t.columns]
    if max_columns is not None and len(cols) > max_columns:
        cols = cols[:max_columns] + [f"... {len(cols) - max_columns} more columns"]
    parts = [f"{t.name}({', '.join(cols)})"]
    if t.primary_key:
        parts.append(f"primary key ({', '.join(t.primary_key)})")
    parts.extend(f"{c} -> {rt}.{rc}" for c, rt, rc in t.foreign_keys)
    return "; ".join(parts)


def describe_database(
    db_path: str | Path, *, max_chars: int = 4000, sample_rows: int = 3, max_value_chars: int = 40
) -> str:
    """The schema text for a prompt, at most ``max_chars`` characters (see the module doc)."""
    tables = read_tables(str(db_path), max(sample_rows, 0))
    if not tables:
        return "(the database has no tables)"
    # 1. Full DDL with sample rows, then fewer rows.
    for n in range(sample_rows, -1, -1):
        blocks = []
        for t in tables:
            rows = _rows_block(t, n, max_value_chars)
            blocks.append(t.ddl + ("\n" + rows if rows else ""))
        text = "\n\n".join(blocks)
        if len(text) <= max_chars:
            return text
    # 2. One compact line per table, then fewer columns per table.
    for max_columns in (None, 12, 8, 5, 3):
        text = "\n".join(_compact(t, max_columns) for t in tables)
        if len(text) <= max_chars:
            return text
    # 3. As many tables as fit, naming the rest.
    lines: list[str] = []
    used = 0
    for i, t in enumerate(tables):
        line = _compact(t, 3)
        rest = tables[i + 1 :]
        note = f"\n(and {len(tables) - i} more tables: {', '.join(x.name for x in tables[i:])})"
        if used + len(line) + 1 + (len(note) if rest else 0) > max_chars:
            lines.append(note.strip())
            break
        lines.append(line)
        used += len(line) + 1
    return "\n".join(lines)[:max_chars]
