"""The leak detector itself: it must notice what it is meant to notice."""

from __future__ import annotations

import socket
import threading

import pytest


def test_a_clean_block_passes(resources):
    before = resources.snapshot()
    s = socket.socket()
    s.close()
    resources.assert_no_leaks(before, settle_s=0.5)


def test_a_leaked_socket_and_thread_are_reported(resources):
    before = resources.snapshot()
    s = socket.socket()
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, name="leaky", daemon=True)
    t.start()
    try:
        with pytest.raises(pytest.fail.Exception, match="leaky"):
            resources.assert_no_leaks(before, settle_s=0.2)
    finally:
        stop.set()
        t.join()
        s.close()
    assert resources.peak_rss_mb() > 10
