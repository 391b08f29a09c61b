"""Fixtures for the reliability suite: hostile input must cost only its own episode.

``resources`` snapshots what a process can leak — threads, open file descriptors, sockets — and
its peak RSS, so a test can assert that nothing outlived the episodes it ran and that memory
stayed bounded::

    def test_something(resources):
        before = resources.snapshot()
        ...  # run hostile episodes
        resources.assert_no_leaks(before)
        assert resources.peak_rss_mb() < 800
"""

from __future__ import annotations

import gc
import os
import resource
import threading
import time
from dataclasses import dataclass

import psutil
import pytest


@dataclass(frozen=True)
class Snapshot:
    """What the process holds at one moment."""

    threads: frozenset[str]
    fds: int
    sockets: int

    def __str__(self) -> str:
        return f"{len(self.threads)} threads, {self.fds} fds, {self.sockets} sockets"


class Resources:
    """Counts threads, fds and sockets of this process; reads its peak RSS."""

    def __init__(self) -> None:
        self._proc = psutil.Process(os.getpid())

    def snapshot(self) -> Snapshot:
        gc.collect()
        threads = frozenset(f"{t.name}#{t.ident}" for t in threading.enumerate() if t.is_alive())
        return Snapshot(threads=threads, fds=self._proc.num_fds(), sockets=len(self._proc.net_connections(kind="all")))

    def assert_no_leaks(self, before: Snapshot, *, settle_s: float = 5.0, fd_slack: int = 0) -> Snapshot:
        """Wait up to ``settle_s`` for threads, fds and sockets to return to ``before``; fail
        naming what is left. ``fd_slack`` allows lazily created, process-lifetime fds (a
        selector opened once) — give the exact number and say why at the call site."""
        deadline = time.monotonic() + settle_s
        while True:
            after = self.snapshot()
            new_threads = sorted(after.threads - before.threads)
            extra_fds = after.fds - before.fds - fd_slack
            extra_sockets = after.sockets - before.sockets
            if not new_threads and extra_fds <= 0 and extra_sockets <= 0:
                return after
            if time.monotonic() > deadline:
                pytest.fail(
                    f"resources left behind: before {before}, after {after}; new threads {new_threads[:20]}, "
                    f"{extra_fds} extra fds, {extra_sockets} extra sockets"
                )
            time.sleep(0.05)

    @staticmethod
    def peak_rss_mb() -> float:
        """Peak resident memory of this process so far (``ru_maxrss``), in MiB."""
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0

    def rss_mb(self) -> float:
        """Current resident memory of this process, in MiB."""
        return self._proc.memory_info().rss / (1024.0 * 1024.0)


@pytest.fixture
def resources() -> Resources:
    return Resources()
