"""The process that runs untrusted SQL for :mod:`.sandbox`; standard library only.

:class:`~.sandbox.SQLSandbox` starts this file as a script (``python -I -S sql_worker.py LIMITS``)
so that no query can cost the calling process anything but the bytes of its (capped) result: a
query that loops inside one SQLite C call (``printf('%.*c', 1e9, 'x')``) is killed from outside
at its time limit, and one that allocates without bound hits this process's address-space limit
(``RLIMIT_AS``), not the trainer's memory.

Protocol, on stdin/stdout: each message is a 4-byte big-endian length and a pickle. A request is
``(db_path, sql, timeout_s)``; the answer is the dict :func:`QueryRunner.run` returns. The process
serves requests one at a time until stdin closes.

This module is also imported (``QueryRunner``) by the tests, which run it in-process.
"""

from __future__ import annotations

import json
import pickle
import resource
import signal
import sqlite3
import struct
import sys
import time
from pathlib import Path
from typing import Any

# Pragmas that only report; allowed with or without an argument (the argument is a table/index
# name for these, never a new setting).
_READONLY_PRAGMAS = frozenset(
    {
        "table_info",
        "table_xinfo",
        "table_list",
        "index_list",
        "index_info",
        "index_xinfo",
        "foreign_key_list",
        "collation_list",
        "database_list",
        "function_list",
    }
)
_DENIED_FUNCTIONS = frozenset({"load_extension", "fts3_tokenizer"})
_ALLOWED_ACTIONS = frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, getattr(sqlite3, "SQLITE_RECURSIVE", 33)}
)
# SQLite's limit codes (sqlite3.h); Python 3.11 exposes them as constants, older ones do not.
_LIMIT_LENGTH = getattr(sqlite3, "SQLITE_LIMIT_LENGTH", 0)
_LIMIT_SQL_LENGTH = getattr(sqlite3, "SQLITE_LIMIT_SQL_LENGTH", 1)
_LIMIT_COLUMN = getattr(sqlite3, "SQLITE_LIMIT_COLUMN", 2)
_LIMIT_ATTACHED = getattr(sqlite3, "SQLITE_LIMIT_ATTACHED", 7)
_LIMIT_LIKE_PATTERN_LENGTH = getattr(sqlite3, "SQLITE_LIMIT_LIKE_PATTERN_LENGTH", 8)

#: Bytes counted for a value that is neither text nor a blob (an int, a float, NULL), and for
#: each row on top of its values: roughly what Python holds for them.
VALUE_OVERHEAD = 8
ROW_OVERHEAD = 64
#: Rows fetched between two checks of the deadline while results are decoded.
_CHECK_EVERY = 256


def ro_uri(path: str | Path) -> str:
    """A read-only URI for ``path``: ``mode=ro`` refuses writes at the pager level and
    ``immutable=1`` keeps SQLite from touching anything beside the file (no locks, no journal)."""
    return Path(path).resolve().as_uri() + "?mode=ro&immutable=1"


def _decode_text(raw: bytes) -> str:
    # Exactly the official evaluator's text_factory: some Spider databases hold invalid UTF-8.
    return raw.decode(errors="ignore")


def row_bytes(row: tuple[Any, ...]) -> int:
    """What a fetched row counts against ``max_result_bytes``."""
    n = ROW_OVERHEAD
    for v in row:
        n += len(v) if isinstance(v, (str, bytes)) else VALUE_OVERHEAD
    return n


class _Connection:
    """One read-only connection with its per-query state (deadline, tables read)."""

    def __init__(self, path: str, limits: dict[str, Any]) -> None:
        self.limits = limits
        self.deadline = 0.0
        self.timed_out = False
        self.tables_read: set[str] = set()
        self.tables_scanned: set[str] = set()
        self.denied: list[str] = []
        # cached_statements=0: a statement reused from the cache is not compiled again, so the
        # authorizer would not see (nor record) what it reads.
        self.conn = sqlite3.connect(ro_uri(path), uri=True, isolation_level=None, cached_statements=0)
        self.conn.text_factory = _decode_text
        if hasattr(self.conn, "enable_load_extension"):
            self.conn.enable_load_extension(False)
        self.conn.setlimit(_LIMIT_ATTACHED, 0)
        self.conn.setlimit(_LIMIT_LENGTH, limits["max_value_bytes"])
        self.conn.setlimit(_LIMIT_SQL_LENGTH, limits["max_sql_bytes"])
        self.conn.setlimit(_LIMIT_COLUMN, limits["max_columns"])
        self.conn.setlimit(_LIMIT_LIKE_PATTERN_LENGTH, limits["max_like_pattern_bytes"])
        # Temp storage (sorts, temp b-trees) in memory, where the heap limit caps it (main()
        # sets it in the worker), instead of unbounded temp files on disk.
        self.conn.execute("PRAGMA temp_store = MEMORY")
        self.conn.set_authorizer(self._authorize)
        self.conn.set_progress_handler(self._progress, limits["progress_every"])

    def _authorize(self, action: int, arg1: str | None, arg2: str | None, db: str | None, source: str | None) -> int:
        if action == sqlite3.SQLITE_READ:
            if arg1:
                # A column read names its database ("main"); a bare scan does not, and a CTE
                # scanned that way is reported under its own name.
                (self.tables_read if arg2 and db else self.tables_scanned).add(arg1.lower())
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION:
            if (arg2 or "").lower() in _DENIED_FUNCTIONS:
                self.denied.append(f"function {arg2}")
                return sqlite3.SQLITE_DENY
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_PRAGMA:
            if (arg1 or "").lower() in _READONLY_PRAGMAS:
                return sqlite3.SQLITE_OK
            self.denied.append(f"PRAGMA {arg1}")
            return sqlite3.SQLITE_DENY
        if action in _ALLOWED_ACTIONS:
            return sqlite3.SQLITE_OK
        self.denied.append(f"action {action} ({arg1}, {arg2})")
        return sqlite3.SQLITE_DENY

    def _progress(self) -> int:
        if time.monotonic() > self.deadline:
            self.timed_out = True
            return 1
        return 0

    def run(self, sql: str, timeout_s: float) -> dict[str, Any]:
        self.tables_read = set()
        self.tables_scanned = set()
        self.denied = []
        self.timed_out = False
        start = time.monotonic()
        self.deadline = start + timeout_s
        max_rows, max_bytes = self.limits["max_rows"], self.limits["max_result_bytes"]
        cursor = self.conn.cursor()
        try:
            cursor.execute(sql)
            description = cursor.description or ()
            rows: list[tuple[Any, ...]] = []
            size = 0
            # Row by row, counting bytes as they come: a result is refused before it is held.
            for row in cursor:
                size += row_bytes(row)
                if size > max_bytes:
                    return self._fail("too_large", f"the result holds more than {max_bytes} bytes", start)
                rows.append(row)
                if len(rows) > max_rows:
                    return self._fail("too_many_rows", f"the query returned more than {max_rows} rows", start)
                if len(rows) % _CHECK_EVERY == 0 and time.monotonic() > self.deadline:
                    self.timed_out = True  # decoding rows is not covered by the progress handler
                    raise sqlite3.OperationalError("interrupted")
            return {
                "rows": rows,
                "num_columns": len(description),
                "column_names": tuple(str(d[0]) for d in description),
                "tables_read": frozenset(self.tables_read),
                "tables_scanned": frozenset(self.tables_scanned),
                "result_bytes": size,
                "elapsed_s": time.monotonic() - start,
            }
        except sqlite3.ProgrammingError as exc:
            kind = "multiple_statements" if "one statement at a time" in str(exc) else "error"
            return self._fail(kind, str(exc), start)
        except sqlite3.Warning as exc:  # older Pythons report several statements this way
            return self._fail("multiple_statements", str(exc), start)
        except sqlite3.DatabaseError as exc:
            text = str(exc)
            if self.timed_out:
                return self._fail("timeout", f"the query ran past its {timeout_s:g} s limit", start)
            if self.denied or "not authorized" in text:
                return self._fail("denied", f"not allowed in the sandbox: {', '.join(self.denied) or exc}", start)
            if any(s in text for s in ("too big", "too many columns", "out of memory", "pattern too complex")):
                return self._fail("too_large", f"{text} (limits: {_size_limits(self.limits)})", start)
            return self._fail("error", text, start)
        except MemoryError:
            return self._fail("too_large", f"out of memory (limits: {_size_limits(self.limits)})", start)
        except (ValueError, OverflowError, UnicodeError) as exc:
            # NUL characters in the SQL, integers too large for SQLite, ...
            return self._fail("error", f"{type(exc).__name__}: {exc}", start)
        finally:
            cursor.close()

    def _fail(self, kind: str, message: str, start: float) -> dict[str, Any]:
        return {
            "rows": None,
            "error": kind,
            "message": message,
            "tables_read": frozenset(self.tables_read),
            "elapsed_s": time.monotonic() - start,
        }

    def close(self) -> None:
        self.conn.close()


def _size_limits(limits: dict[str, Any]) -> str:
    return (
        f"{limits['max_value_bytes']} bytes a value, {limits['max_columns']} columns, "
        f"{limits['max_result_bytes']} bytes a result, {limits.get('max_temp_bytes', 0)} bytes of SQLite memory and temp storage"
    )


class QueryRunner:
    """Runs queries on read-only connections, kept open per database file (opening one costs a
    schema parse)."""

    def __init__(self, limits: dict[str, Any], max_open: int = 8) -> None:
        self.limits = limits
        self.max_open = max_open
        self._open: dict[str, _Connection] = {}

    def run(self, db_path: str, sql: str, timeout_s: float) -> dict[str, Any]:
        conn = self._open.pop(db_path, None)
        if conn is None:
            try:
                conn = _Connection(db_path, self.limits)
            except sqlite3.Error as exc:
                return {"rows": None, "error": "error", "message": f"cannot open {db_path}: {exc}"}
        self._open[db_path] = conn  # most recently used last
        while len(self._open) > self.max_open:
            self._open.pop(next(iter(self._open))).close()
        return conn.run(sql, timeout_s)

    def close(self) -> None:
        for conn in self._open.values():
            conn.close()
        self._open.clear()


def _read_exactly(stream: Any, n: int) -> bytes | None:
    data = stream.read(n)
    return data if data is not None and len(data) == n else None


def main(argv: list[str]) -> int:
    limits = json.loads(argv[1])
    # Ctrl-C in a terminal reaches the whole process group: the parent decides, not us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    memory = int(limits.get("max_worker_memory_bytes") or 0)
    if memory > 0:
        try:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        except (ValueError, OSError):  # not supported here (macOS): the other limits still hold
            pass
    # Process-wide in SQLite, so set here, in the worker, never by a caller importing QueryRunner.
    heap = int(limits.get("max_temp_bytes") or 0)
    if heap > 0:
        sqlite3.connect(":memory:").execute(f"PRAGMA hard_heap_limit = {heap}").close()
    runner = QueryRunner(limits)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        header = _read_exactly(stdin, 4)
        if header is None:
            return 0
        payload = _read_exactly(stdin, struct.unpack("!I", header)[0])
        if payload is None:
            return 0
        db_path, sql, timeout_s = pickle.loads(payload)
        result = runner.run(db_path, sql, timeout_s)
        try:
            data = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
        except MemoryError:
            result = {"rows": None, "error": "too_large", "message": "out of memory while sending the result"}
            data = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
        stdout.write(struct.pack("!I", len(data)) + data)
        stdout.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
