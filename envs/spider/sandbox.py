"""Run untrusted SQL against a Spider database without any way to change it.

Every query a policy writes runs here. The defences are layered, so that no single mistake opens
the database:

* the file is opened through a URI with ``mode=ro`` (SQLite refuses every write at the pager
  level) and ``immutable=1`` (no locks, no journal, nothing created next to the file);
* an authorizer allows only reading: ``SELECT``, column reads, functions (except
  ``load_extension`` and ``fts3_tokenizer``), recursive CTEs and a short list of read-only
  introspection pragmas. Everything else (INSERT/UPDATE/DELETE, DDL, ATTACH, transactions,
  ``PRAGMA writable_schema`` or any other pragma that can change state) is denied at compile time;
* attaching databases is also limited to zero and extension loading disabled;
* a progress handler interrupts a query past its time limit (or when the episode is cancelled);
* at most ``max_rows`` rows are fetched, and strings/blobs are capped at ``max_value_bytes``;
* SQL longer than ``max_sql_bytes`` is rejected before SQLite parses it (parsing is not
  interruptible).

Results are fetched the way Spider's official evaluator fetches them (``fetchall`` of tuples,
text decoded as UTF-8 with undecodable bytes dropped), so rows compare exactly as there.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["SandboxLimits", "ExecResult", "SQLSandbox", "database_tables"]

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


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one query."""

    #: Wall-clock seconds a query may run, fetching included.
    timeout_s: float = 5.0
    #: Rows fetched at most; a query returning more fails with ``too_many_rows``. Spider's largest
    #: gold result has ~10k rows (train) and 1,860 (dev), far below the default.
    max_rows: int = 100_000
    #: SQLite ``SQLITE_LIMIT_LENGTH``: the largest string or blob a query may build.
    max_value_bytes: int = 10_000_000
    #: SQL text longer than this (UTF-8 bytes) is refused without being parsed.
    max_sql_bytes: int = 100_000
    #: The progress handler runs every this many SQLite VM instructions.
    progress_every: int = 1_000

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.max_rows <= 0 or self.max_value_bytes <= 0 or self.max_sql_bytes <= 0:
            raise ValueError(f"sandbox limits must be positive: {self}")


@dataclass
class ExecResult:
    """What running one query gave. ``rows`` is ``None`` exactly when ``error`` is set."""

    rows: list[tuple] | None
    #: Number of result columns (known even when no row came back).
    num_columns: int = 0
    column_names: tuple[str, ...] = ()
    #: ``None`` when it ran; else one of ``denied``, ``timeout``, ``too_many_rows``,
    #: ``multiple_statements``, ``too_long``, ``cancelled``, ``error``.
    error: str | None = None
    message: str = ""
    #: Tables (lower-cased) whose columns the query reads from the database file, as the
    #: authorizer saw them while compiling it (through views too).
    tables_read: frozenset[str] = field(default_factory=frozenset)
    #: Names (lower-cased) scanned without reading a column (``SELECT count(*) FROM t``): SQLite
    #: reports database tables and CTEs alike here, so a caller must tell them apart.
    tables_scanned: frozenset[str] = field(default_factory=frozenset)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


def _ro_uri(path: Path) -> str:
    # as_uri() percent-encodes; immutable=1 keeps SQLite from touching anything beside the file
    # (which also makes read-only directories work).
    return path.resolve().as_uri() + "?mode=ro&immutable=1"


def _decode_text(raw: bytes) -> str:
    # Exactly the official evaluator's text_factory: some Spider databases hold invalid UTF-8.
    return raw.decode(errors="ignore")


class _Connection:
    """One read-only connection with its per-query state (deadline, tables read)."""

    def __init__(self, path: Path, limits: SandboxLimits) -> None:
        self.limits = limits
        self.deadline = 0.0
        self.cancel: threading.Event | None = None
        self.cancelled = False
        self.timed_out = False
        self.tables_read: set[str] = set()
        self.tables_scanned: set[str] = set()
        self.denied: list[str] = []
        # check_same_thread=False: a connection moves between threads through the pool, but is
        # used by one thread at a time. cached_statements=0: a statement reused from the cache is
        # not compiled again, so the authorizer would not see (nor record) what it reads.
        self.conn = sqlite3.connect(
            _ro_uri(path), uri=True, isolation_level=None, check_same_thread=False, cached_statements=0
        )
        self.conn.text_factory = _decode_text
        if hasattr(self.conn, "enable_load_extension"):
            self.conn.enable_load_extension(False)
        self.conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        self.conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limits.max_value_bytes)
        self.conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, limits.max_sql_bytes)
        self.conn.set_authorizer(self._authorize)
        self.conn.set_progress_handler(self._progress, limits.progress_every)

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
        if self.cancel is not None and self.cancel.is_set():
            self.cancelled = True
            return 1
        if time.monotonic() > self.deadline:
            self.timed_out = True
            return 1
        return 0

    def run(self, sql: str, timeout_s: float, cancel: threading.Event | None) -> ExecResult:
        self.tables_read = set()
        self.tables_scanned = set()
        self.denied = []
        self.timed_out = self.cancelled = False
        self.cancel = cancel
        start = time.monotonic()
        self.deadline = start + timeout_s
        cursor = self.conn.cursor()
        try:
            cursor.execute(sql)
            description = cursor.description or ()
            rows: list[tuple] = []
            batch = max(1, min(1024, self.limits.max_rows + 1))
            while True:
                chunk = cursor.fetchmany(batch)
                if not chunk:
                    break
                rows.extend(chunk)
                if len(rows) > self.limits.max_rows:
                    return self._fail(
                        "too_many_rows", f"the query returned more than {self.limits.max_rows} rows", start
                    )
                if time.monotonic() > self.deadline:  # decoding rows is not covered by the handler
                    self.timed_out = True
                    raise sqlite3.OperationalError("interrupted")
            return ExecResult(
                rows=rows,
                num_columns=len(description),
                column_names=tuple(str(d[0]) for d in description),
                tables_read=frozenset(self.tables_read),
                tables_scanned=frozenset(self.tables_scanned),
                elapsed_s=time.monotonic() - start,
            )
        except sqlite3.ProgrammingError as exc:
            kind = "multiple_statements" if "one statement at a time" in str(exc) else "error"
            return self._fail(kind, str(exc), start)
        except sqlite3.Warning as exc:  # older Pythons report several statements this way
            return self._fail("multiple_statements", str(exc), start)
        except sqlite3.DatabaseError as exc:
            if self.cancelled:
                return self._fail("cancelled", "the episode was cancelled", start)
            if self.timed_out:
                return self._fail("timeout", f"the query ran past its {timeout_s:g} s limit", start)
            if self.denied or "not authorized" in str(exc):
                return self._fail("denied", f"not allowed in the sandbox: {', '.join(self.denied) or exc}", start)
            return self._fail("error", str(exc), start)
        except (ValueError, OverflowError, MemoryError, UnicodeError) as exc:
            # NUL characters in the SQL, integers too large for SQLite, ...
            return self._fail("error", f"{type(exc).__name__}: {exc}", start)
        finally:
            cursor.close()
            self.cancel = None

    def _fail(self, kind: str, message: str, start: float) -> ExecResult:
        return ExecResult(
            rows=None,
            error=kind,
            message=message,
            tables_read=frozenset(self.tables_read),
            elapsed_s=time.monotonic() - start,
        )

    def close(self) -> None:
        self.conn.close()


class SQLSandbox:
    """Runs queries read-only under :class:`SandboxLimits`; thread-safe.

    Connections are pooled per database file (opening one costs a schema parse) and handed to one
    thread at a time.
    """

    def __init__(self, limits: SandboxLimits | None = None, *, max_idle_per_db: int = 4) -> None:
        self.limits = limits or SandboxLimits()
        self._idle: dict[Path, list[_Connection]] = {}
        self._lock = threading.Lock()
        self._max_idle = max_idle_per_db

    def run(
        self,
        db_path: str | Path,
        sql: str,
        *,
        timeout_s: float | None = None,
        cancel: threading.Event | None = None,
    ) -> ExecResult:
        """Run ``sql`` (one statement) on ``db_path``; never raises for a bad query."""
        if not isinstance(sql, str):
            raise TypeError(f"sql must be a str, not {type(sql).__name__}")
        if len(sql.encode("utf-8", errors="surrogatepass")) > self.limits.max_sql_bytes:
            return ExecResult(
                rows=None, error="too_long", message=f"the SQL is longer than {self.limits.max_sql_bytes} bytes"
            )
        path = Path(db_path)
        conn = self._acquire(path)
        try:
            return conn.run(sql, self.limits.timeout_s if timeout_s is None else timeout_s, cancel)
        finally:
            self._release(path, conn)

    def _acquire(self, path: Path) -> _Connection:
        with self._lock:
            idle = self._idle.get(path)
            if idle:
                return idle.pop()
        if not path.is_file():
            raise FileNotFoundError(f"no SQLite database at {path}")
        return _Connection(path, self.limits)

    def _release(self, path: Path, conn: _Connection) -> None:
        with self._lock:
            idle = self._idle.setdefault(path, [])
            if len(idle) < self._max_idle:
                idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Close every pooled connection (connections in use close when returned... or GC'd)."""
        with self._lock:
            pools, self._idle = self._idle, {}
        for idle in pools.values():
            for conn in idle:
                conn.close()

    def __enter__(self) -> SQLSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def database_tables(db_path: str | Path) -> list[str]:
    """Names of the user tables and views of a database (``sqlite_*`` internals excluded)."""
    conn = sqlite3.connect(_ro_uri(Path(db_path)), uri=True)
    try:
        rows = conn.execute(
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' "
            "ORDER BY rowid"
        ).fetchall()
    finally:
        conn.close()
    return [r[0] for r in rows]
