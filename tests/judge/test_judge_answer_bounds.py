"""The judge's answer is untrusted input: its decoded size is bounded and ``timeout_s`` is a deadline
for the whole call (a server of our own answers with a gzip bomb, a huge body, or a drip)."""

from __future__ import annotations

import gzip
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentgym_lightning.judge import GroupJudge, JudgeConfig, JudgeFailedWarning
from agentgym_lightning.judge.bounded_http import MAX_ANSWER_BYTES
from agentgym_lightning.testing.mock_openai_server import default_reply
from agentgym_lightning.trajectory import Status

from tests.judge.test_judge import episode

PADDING = 2 * MAX_ANSWER_BYTES  # spaces inside the JSON: a valid answer, just too large


def answer(padding: int = 0) -> bytes:
    reply = json.dumps(default_reply({"messages": [{}]}, json.dumps({"scores": [0.25, 0.75]})))
    return (reply[:-1] + " " * padding + "}").encode("utf-8")


class _Handler(BaseHTTPRequestHandler):
    mode = "plain"

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        mode = self.server.mode  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if mode == "drip":
            # Each piece well within a read timeout, the whole far beyond the deadline.
            body = answer()
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                for i in range(0, len(body), len(body) // 8 + 1):
                    self.wfile.write(body[i : i + len(body) // 8 + 1])
                    self.wfile.flush()
                    time.sleep(0.3)
            except (BrokenPipeError, ConnectionResetError):  # the judge gave up: what is tested
                pass
            return
        body = answer(PADDING if mode in ("bomb", "large") else 0)
        if mode in ("bomb", "small-gzip"):
            body = gzip.compress(body)
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def judge_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def judge_with(server, mode: str, **kw):
    server.mode = mode
    config = JudgeConfig(base_url=f"http://127.0.0.1:{server.server_port}/v1", model="m", max_attempts=1, **kw)
    group = [episode("g", 0, "1"), episode("g", 1, "2")]
    with GroupJudge(config) as judge:
        stats = judge.judge(group)
    return stats, group


def test_a_plain_and_a_gzip_answer_within_bounds_are_read(judge_server):
    for mode in ("plain", "small-gzip"):
        stats, group = judge_with(judge_server, mode)
        assert stats.groups_failed == 0 and [t.final_reward for t in group] == [0.25, 0.75]


@pytest.mark.parametrize("mode", ["bomb", "large"])
def test_an_answer_over_the_bound_fails_its_group(judge_server, mode):
    # Before: decompressed or read whole (a 1 GiB bomb: +3 GB) and accepted.
    with pytest.warns(JudgeFailedWarning, match=r"over 4,194,304 bytes decoded"):
        stats, group = judge_with(judge_server, mode)
    assert stats.groups_failed == 1 and all(t.status is Status.INFRA_FAILED for t in group)


def test_timeout_s_is_a_deadline_for_the_whole_answer(judge_server):
    # Before: every piece came within the read timeout, so the answer was accepted however late.
    with pytest.warns(JudgeFailedWarning, match=r"not complete within timeout_s=1 s"):
        stats, group = judge_with(judge_server, "drip", timeout_s=1.0)
    assert stats.groups_failed == 1 and all(t.status is Status.INFRA_FAILED for t in group)
