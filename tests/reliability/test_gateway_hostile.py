"""Hostile clients at the gateway, over real HTTP and in-process (issue 11, items 2, 3, 5, 6).

Every refusal must be OpenAI-shaped, cost only the request that earned it (no recorded step, the
episode goes on), keep memory bounded while the body streams in, and leave no socket behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import psutil
import pytest

from agentgym_lightning import Completion, Status
from agentgym_lightning.env import AgentEnv
from agentgym_lightning.gateway import Gateway
from agentgym_lightning.gateway.limits import GatewayLimits
from agentgym_lightning.rollouts.in_process import rollout

SMALL = GatewayLimits(
    max_body_bytes=256 * 2**10,
    max_header_bytes=8 * 2**10,
    header_timeout=0.5,
    body_timeout=0.8,
    keep_alive_timeout=0.5,
)
USER = {"role": "user", "content": "hi"}


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    gw = Gateway(limits=SMALL)
    gw.start()
    yield gw
    gw.close()


@contextlib.contextmanager
def blocked_episode(gw: Gateway, transport: str = "inproc") -> Iterator[AgentEnv]:
    """An episode whose agent makes one valid call only once released: hostile requests for
    its id meanwhile must leave it intact (no step recorded, the later call answered)."""
    started, release = threading.Event(), threading.Event()

    def agent(task, ctx):
        started.set()
        release.wait(30)
        return ctx.chat_completion([USER]).text

    env = AgentEnv(agent, [{}], gateway=gw, transport=transport, time_limit=30)
    holder: dict = {}
    t = threading.Thread(target=lambda: holder.setdefault("reset", env.reset(seed=0)))
    t.start()
    assert started.wait(10)
    try:
        yield env
        assert env.trajectory.steps == [], "a refused request left a step"
    finally:
        release.set()
        t.join(10)
    obs, _ = holder["reset"]
    assert obs.request.messages == [USER]
    *_, info = env.step("fine")
    assert info["status"] == "succeeded" and info["trajectory"].result == "fine"


def server_connections(gw: Gateway) -> int:
    """Open server-side connections of this process on the gateway's port."""
    return sum(
        1
        for c in psutil.Process().net_connections(kind="tcp")
        if c.laddr and c.laddr.port == gw.port and c.status == psutil.CONN_ESTABLISHED
    )


class PeakRss:
    """Samples this process's RSS every 5 ms while in the ``with`` block: ``peak - base`` in MiB."""

    def __enter__(self) -> PeakRss:
        self._proc = psutil.Process()
        self.base = self.peak = self._proc.memory_info().rss / 2**20
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="rss-sampler")
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self._proc.memory_info().rss / 2**20)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def growth_mb(self) -> float:
        return self.peak - self.base


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP response from a raw socket (status, lower-cased headers, body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response: {data[:200]!r}")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    headers = {k.lower(): v for k, v in headers.items()}
    length = int(headers.get("content-length", 0))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, body


def assert_openai_error(status: int, headers: dict[str, str], body: bytes, expected: int, fragment: str = "") -> None:
    assert status == expected, body[:300]
    error = json.loads(body)["error"]
    assert set(error) >= {"message", "type", "code"} and error["code"] == expected
    assert fragment in error["message"], error
    assert headers.get("x-should-retry") == "false"


def stream_in(gw: Gateway, head: bytes, chunks: Iterator[bytes]) -> tuple[int, dict[str, str], bytes, bool]:
    """Send ``head`` then ``chunks`` from a thread while reading the answer; whether the answer
    came before the sender ran out of chunks (it was refused while streaming in)."""
    sock = socket.create_connection((gw.host, gw.port), timeout=20)
    finished = threading.Event()

    def send() -> None:
        try:
            sock.sendall(head)
            for chunk in chunks:
                sock.sendall(chunk)
        except OSError:
            return  # refused and closed: expected
        finished.set()

    sender = threading.Thread(target=send)
    sender.start()
    try:
        status, headers, body = read_response(sock)
        early = not finished.is_set()
    finally:
        # shutdown, not close: a send blocked in another thread is only woken by shutdown.
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sender.join(20)
        sock.close()
    return status, headers, body, early


def chat_head(gw: Gateway, env: AgentEnv, length_header: str, extra: str = "") -> bytes:
    path = f"/episodes/{env.episode_id}/v1/chat/completions"
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{length_header}\r\n{extra}\r\n".encode()


def endless_chunks(total: int = 2**30) -> Iterator[bytes]:
    chunk = b"x" * 65536
    frame = b"%x\r\n%s\r\n" % (len(chunk), chunk)
    yield b"%x\r\n%s\r\n" % (len(b'{"messages": "'), b'{"messages": "')
    for _ in range(total // len(chunk)):
        yield frame


# ----------------------------------------------------------------------------------- item 2: sizes


def test_a_declared_oversized_body_is_refused_before_any_of_it_is_read(gateway):
    with blocked_episode(gateway) as env:
        sock = socket.create_connection((gateway.host, gateway.port), timeout=10)
        sock.sendall(chat_head(gateway, env, "Content-Length: 100000000"))  # and no body at all
        status, headers, body = read_response(sock)
        assert_openai_error(status, headers, body, 413, "larger than 262144 bytes")
        assert headers["connection"] == "close" and sock.recv(1) == b""
        sock.close()


def test_a_chunked_body_is_refused_while_it_streams_in_and_memory_stays_bounded(gateway):
    with blocked_episode(gateway) as env, PeakRss() as rss:
        head = chat_head(gateway, env, "Transfer-Encoding: chunked")
        results = [None] * 20

        def one(i: int) -> None:
            results[i] = stream_in(gateway, head, endless_chunks())

        threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        deadline = time.monotonic() + 5
        while server_connections(gateway) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server_connections(gateway) == 0, "a refused connection was left open"
    for status, headers, body, early in results:
        assert_openai_error(status, headers, body, 413, "max_body_bytes")
        assert early, "the gateway read the whole body before refusing it"
    # Before: every body was buffered whole (20 x 10 MB took RSS up 530 MB).
    assert rss.growth_mb < 60, f"RSS grew {rss.growth_mb:.0f} MB"


def test_a_huge_header_is_refused_while_it_arrives(gateway):
    with blocked_episode(gateway) as env, PeakRss() as rss:
        head = chat_head(gateway, env, "Content-Length: 2")[:-2] + b"X-Big: "
        status, headers, body, early = stream_in(gateway, head, iter([b"a" * 65536] * 160))  # 10 MB
    assert_openai_error(status, headers, body, 431, "max_header_bytes")
    assert early and rss.growth_mb < 30


@pytest.mark.parametrize("transport", ["http", "inproc"])
def test_an_agent_sending_too_much_gets_a_413_and_goes_on(gateway, transport):
    def agent(task, ctx):
        client = ctx.openai_client()
        try:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 300_000}])
        except openai.APIStatusError as exc:
            refused = exc.status_code
        return refused, client.chat.completions.create(model="m", messages=[USER]).choices[0].message.content

    env = AgentEnv(agent, [{}], gateway=gateway, transport=transport)
    obs, _ = env.reset(seed=0)
    assert obs.request.messages == [USER]
    *_, info = env.step("ok")
    assert info["trajectory"].result == (413, "ok") and len(info["trajectory"].steps) == 1


# ------------------------------------------------------------------------ item 5: idle sockets


def test_silent_slow_and_idle_connections_are_reaped(gateway):
    silent = [socket.create_connection((gateway.host, gateway.port)) for _ in range(30)]
    slow = [socket.create_connection((gateway.host, gateway.port)) for _ in range(10)]
    for s in slow:
        s.sendall(b"GET /health HTTP/1.1\r\nX-Slow: ")  # and never the rest
    slow_body = [socket.create_connection((gateway.host, gateway.port)) for _ in range(5)]
    for s in slow_body:
        s.sendall(b"POST /episodes/x/rewards HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    kept = []
    for _ in range(5):
        s = socket.create_connection((gateway.host, gateway.port))
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(s)[0] == 200
        kept.append(s)
    deadline = time.monotonic() + 10
    while server_connections(gateway) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server_connections(gateway) == 0  # before: all 50 stayed open (keep-alive was 600 s)
    for s in silent + kept:
        s.settimeout(5)
        assert s.recv(1) == b""
    for s in slow:
        s.settimeout(5)
        status, headers, body = read_response(s)
        assert_openai_error(status, headers, body, 408, "head did not arrive within 0.5 s")
    for s in slow_body:
        s.settimeout(5)
        status, headers, body = read_response(s)
        assert_openai_error(status, headers, body, 408, "body did not arrive within 0.8 s")
    for s in silent + slow + slow_body + kept:
        s.close()


def test_slow_bodies_hold_at_most_max_receiving_body_bytes_and_a_prompt_request_still_gets_in():
    """Issue 50 item 6: 60 clients sending 8 MB bodies slowly held +971 MB (every connection may
    hold max_body_bytes until its body is in). Past max_receiving_body_bytes, all connections
    together, the body that began arriving first is refused and freed."""
    limits = dataclasses.replace(SMALL, body_timeout=30.0, max_receiving_body_bytes=512 * 2**10)
    gw = Gateway(limits=limits)
    gw.start()
    receiving = gw._server.bodies
    piece = b"x" * (100 * 2**10)
    slow = []
    try:
        for i in range(6):  # 6 x 100 KiB of 256 KiB bodies: the sixth takes the total past 512 KiB
            s = socket.create_connection((gw.host, gw.port), timeout=10)
            s.sendall(b"POST /episodes/x/rewards HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (256 * 2**10) + piece)
            slow.append(s)
            deadline = time.monotonic() + 10
            while receiving.total < min(i + 1, 5) * len(piece) and time.monotonic() < deadline:
                time.sleep(0.01)  # the server has this body's bytes: the bodies begin in this order
        status, headers, body = read_response(slow[0])
        assert_openai_error(status, headers, body, 408, "max_receiving_body_bytes")
        assert "began arriving first" in json.loads(body)["error"]["message"]
        deadline = time.monotonic() + 10
        while receiving.total < 5 * len(piece) and time.monotonic() < deadline:
            time.sleep(0.01)  # the rest of the sixth body
        assert receiving.total == 5 * len(piece) <= limits.max_receiving_body_bytes
        assert len(receiving.receiving) == 5
        # a request sent at once is served beside the slow ones
        fast = socket.create_connection((gw.host, gw.port), timeout=10)
        fast.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(fast)[0] == 200
        fast.close()
        for s in slow[1:]:  # still arriving, not refused
            s.setblocking(False)
            with pytest.raises(BlockingIOError):
                s.recv(1)
        for s in slow:
            s.close()
        deadline = time.monotonic() + 10
        while receiving.receiving and time.monotonic() < deadline:
            time.sleep(0.01)
        assert receiving.total == 0 and not receiving.receiving  # every closed connection gave its bytes back
    finally:
        for s in slow:
            s.close()
        gw.close()


def test_a_client_that_stops_reading_is_dropped_after_send_timeout():
    """Issue 50 item 6, the other slow client: one that sends a request and stops reading the
    answer held its connection, the response's task and its unsent bytes for as long as it liked."""
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    from agentgym_lightning.gateway.server import ThreadedServer

    size = 64 * 2**20  # more than any socket buffers hold
    big = Route("/big", lambda request: Response(b"x" * size))
    server = ThreadedServer(Starlette(routes=[big]), "127.0.0.1", 0, limits=dataclasses.replace(SMALL, send_timeout=0.5))
    server.start()
    try:
        reader = socket.socket()
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.connect(("127.0.0.1", server.port))
        reader.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(3.0)  # stops reading: six times send_timeout
        reader.settimeout(10)
        received = 0
        with contextlib.suppress(ConnectionResetError):
            while chunk := reader.recv(2**20):
                received += len(chunk)
        assert received < size / 2  # dropped with most of it unsent (before: all 64 MB, once it read again)
        reader.close()
    finally:
        server.stop()


def test_max_receiving_body_bytes_below_one_body_is_refused():
    with pytest.raises(ValueError, match="max_receiving_body_bytes .* is below max_body_bytes"):
        GatewayLimits(max_body_bytes=2**20, max_receiving_body_bytes=2**19)
    assert GatewayLimits().receiving_body_cap() == 8 * GatewayLimits().max_body_bytes


def test_a_call_waiting_for_its_generation_is_never_idle(gateway):
    def agent(task, ctx):
        client = ctx.openai_client()
        first = client.chat.completions.create(model="m", messages=[USER]).choices[0].message.content
        return first, client.chat.completions.create(model="m", messages=[USER]).choices[0].message.content

    env = AgentEnv(agent, [{}], gateway=gateway, transport="http")
    env.reset(seed=0)
    time.sleep(1.0)  # a slow generation: twice every timeout of this gateway
    env.step_async("slow")
    obs, *_ = env.step_wait()
    time.sleep(1.0)
    *_, info = env.step("slower")
    assert info["status"] == "succeeded" and info["trajectory"].result == ("slow", "slower")


def test_the_connection_cap_bounds_sockets_and_an_agent_still_gets_in():
    gw = Gateway(token="s3cret", limits=GatewayLimits(max_connections=16, header_timeout=30))
    gw.start()
    idle = [socket.create_connection((gw.host, gw.port)) for _ in range(100)]
    try:
        time.sleep(0.3)
        assert server_connections(gw) <= 16  # before: every idle socket held a descriptor

        def agent(task, ctx):
            return ctx.openai_client().chat.completions.create(model="m", messages=[USER]).choices[0].message.content

        env = AgentEnv(agent, [{}], gateway=gw, transport="http")
        env.reset(seed=0)
        *_, info = env.step("in")
        assert info["trajectory"].result == "in"
        assert server_connections(gw) <= 16
    finally:
        for s in idle:
            s.close()
        gw.close()


# ------------------------------------------------- items 3 and 6: bad requests, one agent only

# What a backend would reject (or a stream would choke on) that the gateway used to accept.
POISONS = {
    "top_p NaN": b'{"messages": [{"role": "user", "content": "hi"}], "top_p": NaN}',
    "temperature overflow": b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e999}',
    "seed 2**80": {"messages": [USER], "seed": 2**80},
    "seed as a string": {"messages": [USER], "seed": "5"},
    "image part": {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
    "tool_calls a string": {"messages": [USER, {"role": "assistant", "content": None, "tool_calls": "x"}]},
    "tool_calls not objects": {"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [1]}]},
    "tool call with no function": {
        "messages": [USER, {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function"}]}]
    },
    "unknown role": {"messages": [{"role": "robot", "content": "x"}]},
    "content a number": {"messages": [{"role": "user", "content": 5}]},
    "content an object": {"messages": [{"role": "user", "content": {"a": 1}}]},
    "content parts not objects": {"messages": [{"role": "user", "content": [1]}]},
    "stream 'no'": {"messages": [USER], "stream": "no"},
    "stream_options 'x'": {"messages": [USER], "stream": True, "stream_options": "x"},
    "metadata not strings": {"messages": [USER], "metadata": {"a": 1}},
    "tools a string": {"messages": [USER], "tools": "x"},
    "custom tools": {"messages": [USER], "tools": [{"type": "custom", "custom": {"name": "x"}}]},
    "max_tokens 2**40": {"messages": [USER], "max_tokens": 2**40},
    "invalid UTF-8": b'{"messages": [{"role": "user", "content": "\xff"}]}',
    "100k-deep nesting": b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "not an object": b"[1, 2]",
}


def _post(client: httpx.Client, url: str, body: bytes | dict) -> httpx.Response:
    if isinstance(body, bytes):
        return client.post(url, content=body)
    return client.post(url, content=json.dumps(body).encode())


@pytest.mark.parametrize("transport", ["http", "inproc"])
def test_every_poison_is_a_400_for_its_sender_and_leaves_no_step(gateway, transport):
    with blocked_episode(gateway) as env:
        base = gateway.client_base_url(env.episode_id, transport)
        with gateway.http_client(transport) as client:
            for name, body in POISONS.items():
                r = _post(client, f"{base}/chat/completions", body)
                assert_openai_error(r.status_code, dict(r.headers), r.content, 400)
                assert "text/event-stream" not in r.headers.get("content-type", ""), name


def test_a_poison_in_process_as_a_dict_is_refused_the_same(gateway):
    with blocked_episode(gateway) as env:
        for body in ({"messages": [USER], "top_p": float("nan")}, {"messages": [USER], "temperature": float("inf")}):
            with pytest.raises(Exception) as err:
                gateway.submit(env.episode_id, body)
            assert getattr(err.value, "status", None) == 400


@pytest.mark.parametrize("transport", ["http", "inproc"])
def test_rewards_and_variables_refuse_what_is_not_strict_json(gateway, transport):
    with blocked_episode(gateway) as env:
        root = gateway.url if transport == "http" else "http://agentgym.inproc"
        ep = f"{root}/episodes/{env.episode_id}"
        cases = [
            ("rewards", b'{"value": NaN}', "not valid JSON"),
            ("rewards", b'{"value": Infinity}', "not valid JSON"),
            ("rewards", b'{"value": 1e999}', "infinity"),
            ("rewards", b'{"value": true}', "number"),
            ("variables", b'{"": 1}', "non-empty name"),
            ("variables", b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested deeper"),
            ("variables", b'{"a": "\xff"}', "not valid JSON"),
        ]
        with gateway.http_client(transport) as client:
            for route, body, fragment in cases:
                r = client.post(f"{ep}/{route}", content=body)
                assert_openai_error(r.status_code, dict(r.headers), r.content, 400, fragment)
        assert env.trajectory.rewards == [] and env.trajectory.variables == {}


def test_emit_reward_refuses_nan_and_infinity():
    def agent(task, ctx):
        errors = []
        for bad in (float("nan"), float("inf"), float("-inf")):
            try:
                ctx.emit_reward(bad)
            except ValueError as exc:
                errors.append(str(exc))
        ctx.emit_reward(0.5)
        return errors

    env = AgentEnv(agent, [{}], lambda t, r: 0.0)
    _, info = env.reset(seed=0)
    *_, info = env.step("x")
    assert len(info["trajectory"].result) == 3 and all("finite" in e for e in info["trajectory"].result)
    assert info["trajectory"].total_reward == 0.5


def test_malformed_http_and_internal_errors_are_openai_shaped(gateway, monkeypatch):
    sock = socket.create_connection((gateway.host, gateway.port), timeout=5)
    sock.sendall(b"GARBAGE GARBAGE\r\n\r\n")
    status, headers, body = read_response(sock)
    assert_openai_error(status, headers, body, 400, "invalid HTTP request")
    sock.close()

    def broken(episode_id, body):
        raise KeyError("bug")

    monkeypatch.setattr(gateway, "post_variables", broken)
    with blocked_episode(gateway) as env:
        for transport in ("http", "inproc"):
            root = gateway.url if transport == "http" else "http://agentgym.inproc"
            with gateway.http_client(transport) as client:
                r = client.post(f"{root}/episodes/{env.episode_id}/variables", json={"a": 1})
            assert_openai_error(r.status_code, dict(r.headers), r.content, 500, "KeyError")


def _exchange(gw: Gateway, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection; everything the gateway answers until it closes."""
    sock = socket.create_connection((gw.host, gw.port), timeout=5)
    sock.sendall(data)
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    sock.close()
    return out


def test_pipelined_and_upgrade_requests_keep_their_http_semantics(gateway):
    health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    too_big = b"POST /episodes/x/rewards HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n"
    # A request refused behind pipelined ones is answered after them, never in their place.
    out = _exchange(gateway, health + health + too_big)
    assert out.count(b"HTTP/1.1 200 OK") == 2 and out.index(b"HTTP/1.1 413") > out.rindex(b"200 OK")
    # An Upgrade we do not speak (curl --http2 sends h2c) is served as plain HTTP/1.1, then closed
    # (httptools reads nothing after an upgrade)...
    upgrade = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABk\r\n"
    out = _exchange(gateway, health[:-2] + upgrade + b"\r\n" + health)
    assert out.startswith(b"HTTP/1.1 200 OK") and out.count(b"HTTP/1.1 ") == 1
    # ... but one with a body, which httptools would drop unread, is refused before the app sees it.
    out = _exchange(gateway, too_big.replace(b"999999999", b"12")[:-2] + upgrade + b'\r\n{"value": 1}')
    head, body = out.split(b"\r\n\r\n", 1)
    headers = dict(line.lower().split(b": ", 1) for line in head.split(b"\r\n")[1:])
    assert_openai_error(int(head.split()[1]), {k.decode(): v.decode() for k, v in headers.items()}, body, 400, "Upgrade")


def test_requests_pipelined_to_an_ended_episode_are_each_answered_and_the_last_closes(gateway):
    """Issue 50 item 6: 50 requests pipelined to an ended episode got one 404, and the connection
    closed under the other 49. Each is answered now, in order; the last response closes."""
    def agent(task, ctx):
        return ctx.chat_completion([USER]).text

    env = AgentEnv(agent, [{}], gateway=gateway, transport="http")
    env.reset(seed=0)
    env.step("fine")
    body = json.dumps({"model": "m", "messages": [USER]}).encode()
    request = (f"POST /episodes/{env.episode_id}/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    out = _exchange(gateway, request * 50)  # reads until the server closes
    heads = [part.split(b"\r\n\r\n", 1)[0].lower() for part in out.split(b"HTTP/1.1 ")[1:]]
    assert len(heads) == 50 and all(head.startswith(b"404") for head in heads)
    assert [b"connection: close" in head for head in heads] == [False] * 49 + [True]
    env.close()


def test_only_the_culprit_fails_in_a_batch_with_a_real_backend(gateway, hf_policy):
    """One agent of eight sends every poison before its real call: it gets a 400 for each, and
    the round HFPolicy generates holds only valid requests (before: 8 of 8 infra_failed)."""

    def agent(task, ctx):
        refused = []
        if task["culprit"]:
            with ctx.http_client() as http:
                for body in POISONS.values():
                    refused.append(_post(http, f"{ctx.base_url_for_clients}/chat/completions", body).status_code)
        ctx.chat_completion([{"role": "user", "content": f"Say {task['i']}."}], max_tokens=2, temperature=0)
        return refused

    tasks = [{"i": i, "culprit": i == 3} for i in range(8)]
    out = rollout(
        lambda: AgentEnv(agent, tasks, gateway=gateway), hf_policy, episodes=8, concurrency=8, progress=False
    )
    assert [t.status for t in out] == [Status.SUCCEEDED] * 8
    culprit = next(t for t in out if t.task["culprit"])
    assert culprit.result == [400] * len(POISONS) and len(culprit.steps) == 1
    assert all(isinstance(s.completion, Completion) for t in out for s in t.steps)


# ------------------------------------ issue 37 item 12: the work a request may cause is bounded

@pytest.fixture
def bounded() -> Iterator[Gateway]:
    gw = Gateway(limits=dataclasses.replace(SMALL, max_json_values=2_000, max_messages=50, max_tools=20, max_object_keys=30))
    gw.start()
    yield gw
    gw.close()


@pytest.mark.parametrize("transport", ["http", "inproc"])
def test_too_many_items_or_values_are_refused_before_any_is_checked(bounded, transport):
    """The issue's payloads, scaled to the test's limits: a 413 naming the limit, in the wire's
    shape, no step, and the episode's next call works (blocked_episode)."""
    cases = [
        ("responses", {"input": [{}] * 51}, "max_messages"),
        ("responses", {"input": [{"type": "function_call", "call_id": 1}] * 51}, "max_messages"),
        ("chat/completions", {"messages": [USER] * 51}, "max_messages"),
        ("chat/completions", {"messages": [USER], "tools": [{}] * 21}, "max_tools"),
        ("messages", {"max_tokens": 5, "messages": [USER] * 51}, "max_messages"),
        ("chat/completions", {"messages": [USER], "metadata": {"a": [[]] * 1_000}, "x": [0] * 1_000}, "max_json_values"),
        ("chat/completions", {"messages": [USER], "metadata": {str(i): i for i in range(31)}}, "max_object_keys"),
        ("responses", {"input": "x", "prompt": {"id": "p", "variables": {str(i): i for i in range(31)}}}, "max_object_keys"),
    ]
    with blocked_episode(bounded) as env:
        base = bounded.client_base_url(env.episode_id, transport)
        with bounded.http_client(transport) as client:
            for path, body, limit in cases:
                r = client.post(f"{base}/{path}", json=body)
                assert r.status_code == 413, (path, limit, r.text[:300])
                message = r.json()["error"]["message"]
                assert limit in message and len(message) < 400, message
                if path == "messages":
                    assert r.json()["type"] == "error"  # Anthropic's shape


def test_a_list_of_bad_items_stops_at_the_first_so_its_error_does_not_grow():
    from openai.types.responses.response_create_params import ResponseCreateParamsBase
    from pydantic import ValidationError

    from agentgym_lightning.gateway.validation import _params_validator

    validator = _params_validator(ResponseCreateParamsBase)
    errors = []
    for n in (1, 30):
        with pytest.raises(ValidationError) as err:
            validator.validate_python({"model": "m", "input": [{}] * n}, strict=True)
        errors.append(err.value.error_count())
    assert errors[1] == errors[0]  # 30 bad items: the first one's errors, not 30 times as many


def test_a_large_body_is_checked_off_the_event_loop(gateway, monkeypatch):
    """Checking a body holds the GIL in pydantic-core: a large one is checked on a worker
    thread, never on the loop that serves every other episode's calls."""
    import asyncio

    on_loop = []
    submit = gateway.submit

    def recording_submit(*args, **kwargs):
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        return submit(*args, **kwargs)

    monkeypatch.setattr(gateway, "submit", recording_submit)
    with blocked_episode(gateway) as env:
        base = gateway.client_base_url(env.episode_id, "http")
        with gateway.http_client("http") as client:
            small = client.post(f"{base}/chat/completions", json={"messages": [USER], "seed": "x"})
            large = client.post(f"{base}/chat/completions", json={"messages": [USER], "seed": "x" * 100_000})
        assert small.status_code == large.status_code == 400
        assert on_loop == [True, False]


# --------------------------------------------- issue 37 item 14: 4xx (never 500) in the wire's shape


def test_an_anthropic_tool_use_id_that_is_not_a_string_is_a_400_in_anthropics_shape(gateway):
    with blocked_episode(gateway) as env:
        base = gateway.client_base_url(env.episode_id, "http")
        with gateway.http_client("http") as client:
            for bad_id in (["a"], {"a": 1}):
                use = {"type": "tool_use", "id": bad_id, "name": "f", "input": {}}
                body = {"max_tokens": 5, "messages": [USER, {"role": "assistant", "content": [use]}, USER]}
                r = client.post(f"{base}/messages", json=body)
                assert r.status_code == 400, r.text
                assert r.json()["type"] == "error" and ".id" in r.json()["error"]["message"]


def test_a_413_on_the_anthropic_route_comes_in_anthropics_shape(gateway):
    with blocked_episode(gateway) as env:
        for path, anthropic_shape in (("messages", True), ("chat/completions", False)):
            sock = socket.create_connection((gateway.host, gateway.port), timeout=5)
            head = f"POST /episodes/{env.episode_id}/v1/{path} HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n"
            sock.sendall(head.encode())
            status, headers, body = read_response(sock)
            sock.close()
            assert status == 413
            data = json.loads(body)
            if anthropic_shape:
                assert data["type"] == "error" and data["error"]["type"] == "request_too_large"
            else:
                assert_openai_error(status, headers, body, 413)


def _strict(body: bytes):
    def refuse(name):
        raise ValueError(f"{name} in a response body")

    return json.loads(body, parse_constant=refuse)


def test_a_policys_deep_or_non_finite_tool_arguments_never_fail_the_answer():
    """Tool-call arguments past the JSON decoder's recursion limit, or holding NaN/1e999: the
    Anthropic agent gets a 200 whose body is strict JSON (the input it cannot hold is ``{}``)."""
    deep = '{"a": ' + "[" * 5_000 + "]" * 5_000 + "}"
    answers = [
        Completion(text="", tool_calls=[{"id": f"call_{i}", "name": "f", "arguments": args}], finish_reason="tool_calls")
        for i, args in enumerate((deep, '{"a": NaN}', '{"a": 1e999}'))
    ]

    def agent(task, ctx):
        out = []
        with ctx.http_client() as http:
            for _ in answers:
                r = http.post(f"{ctx.anthropic_base_url}/v1/messages", json={"max_tokens": 5, "messages": [USER]})
                out.append((r.status_code, _strict(r.content)["content"][0]["input"]))
        return out

    env = AgentEnv(agent, [{}], lambda t, r: 0.0, transport="http")
    env.reset(seed=0)
    for answer in answers[:-1]:
        env.step(answer)
    *_, info = env.step(answers[-1])
    assert info["status"] == "succeeded", info.get("error")
    assert info["trajectory"].result == [(200, {}), (200, {}), (200, {})]


def test_a_call_asking_for_a_billion_tokens_is_capped_and_says_so():
    gw = Gateway(limits=GatewayLimits(max_completion_tokens=64))

    def agent(task, ctx):
        with ctx.http_client() as http:
            r = http.post(f"{ctx.base_url_for_clients}/completions", json={"prompt": "x", "max_tokens": 1_000_000_000})
        return r.json()["choices"][0]["finish_reason"], r.json()["usage"]["completion_tokens"]

    env = AgentEnv(agent, [{}], lambda t, r: 0.0, gateway=gw)
    obs, _ = env.reset(seed=0)
    assert obs.request.sampling.max_tokens == 64  # what the policy is asked for: at most the cap
    # The policy generates up to the cap, and the agent reads it as OpenAI's "length".
    *_, info = env.step(Completion(text="y" * 64, completion_token_ids=list(range(64)), finish_reason="length"))
    assert info["trajectory"].result == ("length", 64)
    gw.close()
