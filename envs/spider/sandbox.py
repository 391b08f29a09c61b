"""Run untrusted SQL against a Spider database without any way to change it, or to cost the
caller more than a bounded result.

Every query a policy writes runs here. The defences are layered, so that no single mistake opens
the database or the process:

* queries run in separate worker processes (:mod:`.sql_worker`, standard library only), so a
  query that hangs inside one SQLite C call is killed at its time limit plus
  ``kill_margin_s``, and one that allocates without bound hits the worker's address-space limit
  (``max_worker_memory_bytes``), never the caller's memory;
* the file is opened through a URI with ``mode=ro`` (SQLite refuses every write at the pager
  level) and ``immutable=1`` (no locks, no journal, nothing created next to the file);
* an authorizer allows only reading: ``SELECT``, column reads, functions (except
  ``load_extension`` and ``fts3_tokenizer``), recursive CTEs and a short list of read-only
  introspection pragmas. Everything else (INSERT/UPDATE/DELETE, DDL, ATTACH, transactions,
  ``PRAGMA writable_schema`` or any other pragma that can change state) is denied at compile time;
* SQLite's own limits on the connection: attached databases 0, ``SQLITE_LIMIT_LENGTH``
  (``max_value_bytes``: the largest string or blob a query may build), ``SQLITE_LIMIT_COLUMN``
  (``max_columns``), ``SQLITE_LIMIT_LIKE_PATTERN_LENGTH``; extension loading disabled;
* a progress handler interrupts a query past its time limit;
* rows are fetched one at a time and counted: past ``max_rows`` rows or ``max_result_bytes``
  bytes the query fails (``too_many_rows``, ``too_large``) before more is held;
* SQL longer than ``max_sql_bytes`` is rejected before SQLite parses it.

Every limit is in :class:`SandboxLimits` and documented in ``docs/limits.md``.

Results are fetched the way Spider's official evaluator fetches them (``fetchall`` of tuples,
text decoded as UTF-8 with undecodable bytes dropped), so rows compare exactly as there.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import select
import sqlite3
import struct
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .sql_worker import ro_uri

__all__ = ["SandboxLimits", "ExecResult", "SQLSandbox", "database_tables", "RESOURCE_ERRORS"]

_WORKER_SCRIPT = Path(__file__).with_name("sql_worker.py")
#: How often a caller waiting for a worker checks its cancel event.
_POLL_S = 0.05

#: Errors that mean the query exhausted a limit rather than being wrong SQL: running the same
#: prediction again (another normalization of it) would only exhaust it again.
RESOURCE_ERRORS = frozenset({"timeout", "too_large", "too_many_rows", "too_long", "cancelled", "crashed"})


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one query (each documented in ``docs/limits.md``)."""

    #: Wall-clock seconds a query may run, fetching included.
    timeout_s: float = 5.0
    #: Rows fetched at most; a query returning more fails with ``too_many_rows``. Spider's largest
    #: gold result has ~10k rows (train) and 1,860 (dev), far below the default.
    max_rows: int = 100_000
    #: SQLite ``SQLITE_LIMIT_LENGTH``: the largest string or blob a query may build (and a
    #: record it may sort). Spider's largest stored value is 213 bytes.
    max_value_bytes: int = 1_000_000
    #: SQLite ``SQLITE_LIMIT_COLUMN``: columns of a result (also of GROUP BY / ORDER BY lists).
    #: Spider's widest gold result has 19 columns and its widest table 26.
    max_columns: int = 100
    #: Bytes a result may hold, counted while rows are fetched (text and blobs by length, other
    #: values 8 bytes, 64 per row). Spider's largest gold result counts ~0.9 MB.
    max_result_bytes: int = 32_000_000
    #: SQL text longer than this (UTF-8 bytes) is refused without being parsed.
    max_sql_bytes: int = 100_000
    #: SQLite ``SQLITE_LIMIT_LIKE_PATTERN_LENGTH``: LIKE/GLOB patterns longer than this fail
    #: (matching costs up to pattern x text).
    max_like_pattern_bytes: int = 1_000
    #: The progress handler runs every this many SQLite VM instructions.
    progress_every: int = 1_000
    #: Address space of a worker process (``RLIMIT_AS``); ``0`` for no limit.
    max_worker_memory_bytes: int = 1 << 30
    #: SQLite's heap in a worker (``PRAGMA hard_heap_limit``), temp storage included: sorts,
    #: temp tables and indexes are kept in memory (``temp_store=MEMORY``), never spilled to
    #: disk, so a query past this fails with ``too_large`` (one ORDER BY over a cross join
    #: spilled 216-446 MB of temp files in 5 s before). Spider's gold queries need a few MB.
    max_temp_bytes: int = 256_000_000
    #: A worker that has not answered ``timeout_s + kill_margin_s`` seconds after it got the query
    #: (one SQLite C call that never checks the clock) is killed; the query fails with ``timeout``.
    kill_margin_s: float = 0.25

    def __post_init__(self) -> None:
        positive = ("timeout_s", "max_rows", "max_value_bytes", "max_columns", "max_result_bytes", "max_sql_bytes",
                    "max_like_pattern_bytes", "progress_every", "kill_margin_s", "max_temp_bytes")
        bad = [name for name in positive if not getattr(self, name) > 0]
        if bad or self.max_worker_memory_bytes < 0:
            raise ValueError(f"sandbox limits must be positive ({', '.join(bad) or 'max_worker_memory_bytes'}): {self}")


@dataclass
class ExecResult:
    """What running one query gave. ``rows`` is ``None`` exactly when ``error`` is set."""

    rows: list[tuple] | None
    #: Number of result columns (known even when no row came back).
    num_columns: int = 0
    column_names: tuple[str, ...] = ()
    #: ``None`` when it ran; else one of ``denied``, ``timeout``, ``too_many_rows``,
    #: ``too_large`` (a value, the columns or the result past its limit, or out of memory),
    #: ``multiple_statements``, ``too_long``, ``cancelled``, ``crashed`` (the worker process
    #: died), ``error``.
    error: str | None = None
    message: str = ""
    #: Tables (lower-cased) whose columns the query reads from the database file, as the
    #: authorizer saw them while compiling it (through views too).
    tables_read: frozenset[str] = field(default_factory=frozenset)
    #: Names (lower-cased) scanned without reading a column (``SELECT count(*) FROM t``): SQLite
    #: reports database tables and CTEs alike here, so a caller must tell them apart.
    tables_scanned: frozenset[str] = field(default_factory=frozenset)
    #: Bytes the result counted against ``max_result_bytes``.
    result_bytes: int = 0
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def shape(self) -> tuple[int, int] | None:
        """``(rows, columns)``, or ``None`` when the query failed."""
        return None if self.rows is None else (len(self.rows), self.num_columns)


class _Worker:
    """One worker process, used by one thread at a time."""

    def __init__(self, limits: SandboxLimits) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(_WORKER_SCRIPT), json.dumps(dataclasses.asdict(limits))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # no terminal signals: the sandbox decides when it ends
            close_fds=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in = self.proc.stdin
        self._out = self.proc.stdout.fileno()

    def send(self, request: tuple[str, str, float]) -> None:
        data = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        self._in.write(struct.pack("!I", len(data)) + data)
        self._in.flush()

    def receive(self, deadline: float, cancel: threading.Event | None) -> dict[str, Any] | str:
        """The worker's answer, or ``"timeout"``/``"cancelled"``/``"crashed"``."""
        header = self._read(4, deadline, cancel)
        if isinstance(header, str):
            return header
        body = self._read(struct.unpack("!I", header)[0], None, cancel)
        if isinstance(body, str):
            return body
        result: dict[str, Any] = pickle.loads(body)
        return result

    def _read(self, n: int, deadline: float | None, cancel: threading.Event | None) -> bytes | str:
        chunks, got = [], 0
        while got < n:
            wait = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
            if wait <= 0:
                return "timeout"
            if cancel is not None and cancel.is_set():
                return "cancelled"
            ready, _, _ = select.select([self._out], [], [], wait)
            if not ready:
                continue
            chunk = os.read(self._out, min(n - got, 1 << 20))
            if not chunk:
                return "crashed"
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.close()

    def close(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:  # a broken pipe on flush: the worker is gone already
                pass
        try:
            self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _close_workers(workers: list[_Worker]) -> None:
    for worker in workers:
        worker.close()


class SQLSandbox:
    """Runs queries read-only under :class:`SandboxLimits`; thread-safe.

    Each query runs in a worker process (started on first use, kept for the next query, and
    replaced when one is killed). At most ``max_workers`` queries run at once; more wait for a
    free worker (the wait does not count against their time limit). ``close()`` ends every
    worker; a worker also ends when this process does (its stdin closes).
    """

    def __init__(self, limits: SandboxLimits | None = None, *, max_workers: int | None = None, max_idle: int = 4) -> None:
        self.limits = limits or SandboxLimits()
        self.max_workers = max_workers or max(4, os.cpu_count() or 1)
        self._slots = threading.BoundedSemaphore(self.max_workers)
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._max_idle = max_idle
        self._closed = False
        self._finalizer = weakref.finalize(self, _close_workers, self._idle)

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
        if not path.is_file():
            raise FileNotFoundError(f"no SQLite database at {path}")
        timeout = self.limits.timeout_s if timeout_s is None else timeout_s
        while not self._slots.acquire(timeout=_POLL_S):
            if cancel is not None and cancel.is_set():
                return ExecResult(rows=None, error="cancelled", message="the episode was cancelled")
        try:
            return self._run_in_worker(str(path.resolve()), sql, timeout, cancel)
        finally:
            self._slots.release()

    def _run_in_worker(self, path: str, sql: str, timeout: float, cancel: threading.Event | None) -> ExecResult:
        worker = self._acquire()
        start = time.monotonic()
        try:
            worker.send((path, sql, timeout))
            answer = worker.receive(start + timeout + self.limits.kill_margin_s, cancel)
        except (BrokenPipeError, OSError):
            answer = "crashed"
        except BaseException:
            worker.kill()  # interrupted mid-conversation: its state is unknown
            raise
        elapsed = time.monotonic() - start
        if isinstance(answer, str):
            worker.kill()
            message = {
                "timeout": f"the query ran past its {timeout:g} s limit (its worker was killed)",
                "cancelled": "the episode was cancelled",
                "crashed": "the query's worker process died (out of memory?)",
            }[answer]
            return ExecResult(rows=None, error=answer, message=message, elapsed_s=elapsed)
        self._release(worker)
        answer.setdefault("error", None)
        if answer["error"] is None and cancel is not None and cancel.is_set():
            answer.update(rows=None, error="cancelled", message="the episode was cancelled")
        return ExecResult(**answer)

    def _acquire(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise RuntimeError("the SQL sandbox is closed")
            while self._idle:
                worker = self._idle.pop()
                if worker.proc.poll() is None:
                    return worker
                worker.close()
        return _Worker(self.limits)

    def _release(self, worker: _Worker) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._max_idle:
                self._idle.append(worker)
                return
        worker.close()

    def close(self) -> None:
        """End every idle worker (one still running a query ends when it returns)."""
        with self._lock:
            self._closed = True
            idle, self._idle[:] = list(self._idle), []
        _close_workers(idle)

    def __enter__(self) -> SQLSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def database_tables(db_path: str | Path) -> list[str]:
    """Names of the user tables and views of a database (``sqlite_*`` internals excluded)."""
    conn = sqlite3.connect(ro_uri(Path(db_path)), uri=True)
    try:
        rows = conn.execute(
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' "
            "ORDER BY rowid"
        ).fetchall()
    finally:
        conn.close()
    return [r[0] for r in rows]
