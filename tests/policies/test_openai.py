"""The ``openai`` backend against fake OpenAI-compatible servers.

Unit-level behaviour goes through ``httpx.MockTransport`` (no socket); the concurrency, retry and
token-id tests use the real-socket mock server (uvicorn on 127.0.0.1, a free port, a thread).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest

from agentgym_lightning.llm import ChatRequest, Completion, SamplingParams
from agentgym_lightning.policies import make_policy
from agentgym_lightning.testing.mock_openai_server import MockOpenAIServer, default_reply
from agentgym_lightning.policies.openai import (
    DEFAULT_CONCURRENCY,
    OpenAIPolicy,
    PolicyBackendError,
)

# A batch of one goes out on the caller's thread (blocking sockets), a larger batch from the
# policy's event loop: both HTTP clients are exercised.
BOTH_PATHS = pytest.mark.parametrize("batch", [1, 3], ids=["sync-path", "async-path"])


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def _request(text: str = "hi", **sampling: Any) -> ChatRequest:
    return ChatRequest(messages=[{"role": "user", "content": text}], sampling=SamplingParams(**sampling))


class Recorder:
    """An ``httpx.MockTransport`` handler: records bodies and answers with ``reply(body)``."""

    def __init__(self, reply: Any = None) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[httpx.Headers] = []
        self.reply = reply or (lambda body: (200, default_reply(body)))

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"object": "list", "data": [{"id": "served-model", "object": "model"}]})
        body = json.loads(request.content)
        self.bodies.append(body)
        self.headers.append(request.headers)
        status, payload = self.reply(body)
        if isinstance(payload, (dict, list)):
            return httpx.Response(status, json=payload)
        return httpx.Response(status, text=str(payload))


def _policy(handler: Any, **kwargs: Any) -> OpenAIPolicy:
    kwargs.setdefault("retry_backoff", 0.001)
    return OpenAIPolicy(
        kwargs.pop("model", "m"), base_url="http://upstream.test/v1", transport=httpx.MockTransport(handler), **kwargs
    )


# --------------------------------------------------------------------------- text and requests


def test_text_completion_and_request_body():
    rec = Recorder(lambda body: (200, default_reply(body, content="Paris.")))
    with _policy(rec, api_key="sk-test") as policy:
        request = ChatRequest(
            messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "capital of France?"}],
            model="policy",  # what the agent called the model: replaced by the upstream's name
            sampling=SamplingParams(temperature=0.3, top_p=0.9, max_tokens=17, stop=["\n"], seed=5),
            stream=True,
            metadata={"trainable": "false"},
            extra={"stream_options": {"include_usage": True}, "user": "agent-7"},
        )
        (completion,) = policy.generate([request])
    assert isinstance(completion, Completion)
    assert completion.text == "Paris."
    assert completion.finish_reason == "stop"
    assert completion.model == "m"
    body = rec.bodies[0]
    assert body["model"] == "m"
    assert body["messages"] == request.messages
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["stop"], body["seed"]) == (0.3, 0.9, 17, ["\n"], 5)
    assert body["user"] == "agent-7"
    for dropped in ("stream", "stream_options", "metadata", "n"):
        assert dropped not in body  # we never stream upstream; metadata is ours
    assert body["logprobs"] is True and body["return_token_ids"] is True
    assert rec.headers[0]["authorization"] == "Bearer sk-test"


def test_a_legacy_completion_goes_to_the_servers_completions_raw():
    paths: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        body = json.loads(request.content)
        assert "messages" not in body and body["prompt"] == "2+2=" and body["logprobs"] == 0
        choice = {"index": 0, "text": " 4", "finish_reason": "length", "token_ids": [7, 8], "logprobs": {"tokens": ["7", "8"], "token_logprobs": [-0.5, -0.25]}}
        return httpx.Response(200, json={"object": "text_completion", "model": "m", "choices": [choice], "prompt_token_ids": [1, 2]})

    raw = ChatRequest(messages=[{"role": "user", "content": "2+2="}], wire="completions", prompt="2+2=")
    with _policy(handler) as policy:
        (completion,) = policy.generate([raw])
    assert paths == ["/v1/completions"]
    assert (completion.text, completion.finish_reason, completion.prompt_token_ids) == (" 4", "length", [1, 2])
    assert (completion.completion_token_ids, completion.logprobs) == ([7, 8], [-0.5, -0.25])


def test_batch_keeps_order():
    rec = Recorder(lambda body: (200, default_reply(body, content=body["messages"][-1]["content"].upper())))
    with _policy(rec) as policy:
        out = policy.generate([_request(f"q{i}") for i in range(20)])
        assert policy.generate([]) == []
    assert [c.text for c in out] == [f"Q{i}" for i in range(20)]


def test_sampling_defaults_overrides_and_extra_body():
    rec = Recorder()
    with _policy(
        rec,
        sampling_defaults={"max_tokens": 64, "temperature": 0.7},
        sampling_overrides={"temperature": 1.0},
        extra_body={"top_k": 20},
        forward_metadata=True,
    ) as policy:
        policy.generate([_request(max_tokens=8), ChatRequest(messages=[{"role": "user", "content": "x"}], metadata={"a": "b"})])
    first, second = rec.bodies
    assert first["max_tokens"] == 8 and first["temperature"] == 1.0 and first["top_k"] == 20
    assert second["max_tokens"] == 64 and second["metadata"] == {"a": "b"}


def test_model_auto_detected_from_models_endpoint():
    rec = Recorder()
    with _policy(rec, model="") as policy:
        (c,) = policy.generate([_request()])
        assert policy.model == "served-model"
    assert rec.bodies[0]["model"] == "served-model"
    assert c.model == "served-model"


def test_base_url_required(monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ValueError, match="base URL"):
        OpenAIPolicy("m")


def test_make_policy_builds_openai_backend():
    policy = make_policy("openai", "served", base_url="http://127.0.0.1:1/v1", concurrency=4)
    try:
        assert isinstance(policy, OpenAIPolicy) and policy.backend == "openai"
        assert policy.model == "served" and policy.concurrency == 4
    finally:
        policy.close()
    assert DEFAULT_CONCURRENCY >= 1024


# --------------------------------------------------------------------------- tool calls


def test_tool_calls_from_server_message():
    def reply(body):
        data = default_reply(body)
        data["choices"][0]["message"] = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ],
        }
        data["choices"][0]["finish_reason"] = "tool_calls"
        return 200, data

    rec = Recorder(reply)
    with _policy(rec) as policy:
        request = ChatRequest(messages=[{"role": "user", "content": "weather in Paris?"}], tools=TOOLS, tool_choice="auto")
        (c,) = policy.generate([request])
    assert rec.bodies[0]["tools"] == TOOLS and rec.bodies[0]["tool_choice"] == "auto"
    assert c.text == "" and c.finish_reason == "tool_calls"
    assert [(tc.id, tc.name, json.loads(tc.arguments)) for tc in c.tool_calls] == [("call_1", "get_weather", {"city": "Paris"})]


def test_tool_calls_parsed_from_text_when_server_has_no_parser():
    text = 'Let me check.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    rec = Recorder(lambda body: (200, default_reply(body, content=text)))
    with _policy(rec) as policy:
        with_tools = ChatRequest(messages=[{"role": "user", "content": "Oslo?"}], tools=TOOLS)
        (c, plain) = policy.generate([with_tools, _request("no tools here")])
    assert c.finish_reason == "tool_calls" and c.text == "Let me check."
    assert c.tool_calls[0].name == "get_weather" and json.loads(c.tool_calls[0].arguments) == {"city": "Oslo"}
    assert plain.tool_calls == [] and plain.text == text  # no tools offered: text left alone
    with _policy(rec, text_tool_calls=False) as policy:
        (raw,) = policy.generate([with_tools])
    assert raw.tool_calls == [] and raw.text == text


# --------------------------------------------------------------------------- token ids


def test_token_ids_and_logprobs_when_server_returns_them():
    def reply(body):
        assert body["return_token_ids"] is True and body["logprobs"] is True
        data = default_reply(body, content="ab")
        data["prompt_token_ids"] = [1, 2, 3]
        data["choices"][0]["token_ids"] = [10, 11, 2]
        data["choices"][0]["logprobs"] = {
            "content": [{"token": t, "logprob": lp, "top_logprobs": []} for t, lp in (("a", -0.1), ("b", -0.2), ("", -0.3))]
        }
        return 200, data

    with _policy(Recorder(reply)) as policy:
        (c,) = policy.generate([_request()])
    assert c.prompt_token_ids == [1, 2, 3]
    assert c.completion_token_ids == [10, 11, 2]
    assert c.logprobs == pytest.approx([-0.1, -0.2, -0.3])


def test_token_ids_absent_stay_none():
    def reply(body):
        data = default_reply({"messages": body["messages"]}, content="plain")  # ignores both extensions
        return 200, data

    with _policy(Recorder(reply)) as policy:
        (c,) = policy.generate([_request()])
    assert c.text == "plain"
    assert c.prompt_token_ids is None and c.completion_token_ids is None and c.logprobs is None


def test_logprobs_without_token_ids_are_kept_and_mismatch_dropped():
    def reply(body):
        data = default_reply({"messages": body["messages"], "logprobs": True}, content="xy")
        if body["messages"][-1]["content"] == "mismatch":
            data["choices"][0]["token_ids"] = [1, 2, 3]  # 3 ids, 2 logprobs: never guess
        return 200, data

    with _policy(Recorder(reply)) as policy:
        kept, dropped = policy.generate([_request("ok"), _request("mismatch")])
    assert kept.completion_token_ids is None and kept.logprobs == [-0.5, -0.5]
    assert dropped.completion_token_ids == [1, 2, 3] and dropped.logprobs is None


def test_return_token_ids_auto_disabled_after_rejection():
    """A server that rejects the extension (OpenAI's API) gets it once, then never again."""
    with MockOpenAIServer(token_ids=False) as server, OpenAIPolicy("m", base_url=server.base_url) as policy:
        first = policy.generate([_request("a"), _request("b")])
        second = policy.generate([_request("c")])
        assert all(c.text == "ok" and c.completion_token_ids is None for c in first + second)
        assert [c.logprobs for c in first + second] == [[-0.5, -0.5]] * 3  # logprobs still asked for
        assert "return_token_ids" not in server.bodies[-1]
    with (
        MockOpenAIServer(token_ids=False) as server,
        OpenAIPolicy("m", base_url=server.base_url, return_token_ids=True) as policy,
    ):
        with pytest.raises(PolicyBackendError, match="return_token_ids") as info:
            policy.generate([_request()])
        assert info.value.status == 400 and not info.value.retryable


def test_token_ids_over_a_real_socket():
    with MockOpenAIServer() as server, OpenAIPolicy("m", base_url=server.base_url) as policy:
        (c,) = policy.generate([_request("hé")])
    assert c.prompt_token_ids == list("hé".encode()) and c.completion_token_ids == list(b"ok")


# --------------------------------------------------------------------------- errors


@BOTH_PATHS
def test_server_error_retried_then_succeeds(batch):
    with MockOpenAIServer(fail_next=2, fail_status=503) as server:
        with OpenAIPolicy("m", base_url=server.base_url, max_retries=3, retry_backoff=0.001) as policy:
            out = policy.generate([_request()] * batch)
            assert [c.text for c in out] == ["ok"] * batch and policy.retries == 2
        assert server.state.requests == batch + 2


def test_server_error_after_retries_raises_policy_backend_error():
    with MockOpenAIServer(fail_next=100, fail_status=500) as server:
        with OpenAIPolicy("m", base_url=server.base_url, max_retries=2, retry_backoff=0.001) as policy:
            with pytest.raises(PolicyBackendError) as info:
                policy.generate([_request()])
        assert server.state.requests == 3  # 1 + 2 retries
    err = info.value
    assert isinstance(err, RuntimeError)
    assert err.status == 500 and err.retryable and err.attempts == 3
    assert "injected failure" in str(err) and "after 3 attempts" in str(err)


def test_client_error_not_retried():
    calls = []

    def reply(body):
        calls.append(1)
        return 400, {"error": {"message": "This model's maximum context length is 2048 tokens", "type": "invalid_request_error"}}

    with _policy(Recorder(reply), max_retries=5, logprobs=True, return_token_ids=True) as policy:
        with pytest.raises(PolicyBackendError, match="maximum context length") as info:
            policy.generate([_request()])
    assert len(calls) == 1 and info.value.status == 400 and not info.value.retryable


@BOTH_PATHS
def test_connection_refused_raises_policy_backend_error(batch):
    sock_port = _free_port()
    with OpenAIPolicy("m", base_url=f"http://127.0.0.1:{sock_port}/v1", max_retries=1, retry_backoff=0.001) as policy:
        with pytest.raises(PolicyBackendError, match="Connect") as info:
            policy.generate([_request()] * batch)
    assert info.value.status is None and info.value.retryable


def test_partial_batch_failure_carries_successes():
    def reply(body):
        if body["messages"][-1]["content"] == "bad":
            return 422, {"error": {"message": "unprocessable"}}
        return 200, default_reply(body)

    with _policy(Recorder(reply)) as policy:
        with pytest.raises(PolicyBackendError) as info:
            policy.generate([_request("good"), _request("bad"), _request("good")])
    err = info.value
    assert set(err.failures) == {1} and err.failures[1].status == 422
    assert [c is not None for c in err.completions] == [True, False, True]
    assert "1 of 3 requests" in str(err)


def test_non_json_and_choiceless_answers():
    with _policy(Recorder(lambda body: (200, "<html>oops</html>")), max_retries=0) as policy:
        with pytest.raises(PolicyBackendError, match="not JSON"):
            policy.generate([_request()])
    with _policy(Recorder(lambda body: (200, {"choices": []})), max_retries=0) as policy:
        with pytest.raises(PolicyBackendError, match="without choices"):
            policy.generate([_request()])


def test_closed_policy_refuses():
    policy = _policy(Recorder())
    policy.close()
    policy.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        policy.generate([_request()])


# --------------------------------------------------------------------------- the HTTP/1.1 client


class RawServer:
    """A socketserver answering each request with ``respond(body) -> bytes`` (raw HTTP), to
    exercise framings uvicorn never sends: chunked bodies, read-to-close, dropped keep-alives."""

    def __init__(self, respond: Any, close_after: bool = False) -> None:
        import socketserver

        outer = self
        self.respond = respond
        self.requests = 0
        self.connections = 0

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                outer.connections += 1
                while True:
                    head = b""
                    while not head.endswith(b"\r\n\r\n"):
                        chunk = self.rfile.readline()
                        if not chunk:
                            return
                        head += chunk
                    length = 0
                    for line in head.split(b"\r\n"):
                        if line.lower().startswith(b"content-length:"):
                            length = int(line.split(b":")[1])
                    body = json.loads(self.rfile.read(length) or b"null")
                    outer.requests += 1
                    self.wfile.write(outer.respond(body))
                    self.wfile.flush()
                    if close_after:
                        return  # drop the connection without saying so

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> RawServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _json_bytes(body: Any, text: str = "ok") -> bytes:
    return json.dumps(default_reply(body, content=text)).encode()


@BOTH_PATHS
def test_http_client_chunked_response(batch):
    def respond(body):
        data = _json_bytes(body, "chunked ok")
        chunks = [data[:10], data[10:]]
        out = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
        for c in chunks:
            out += b"%x;ext=1\r\n%s\r\n" % (len(c), c)
        return out + b"0\r\nx-trailer: 1\r\n\r\n"

    with RawServer(respond) as server, OpenAIPolicy("m", base_url=server.base_url) as policy:
        out = policy.generate([_request("a")] * batch) + policy.generate([_request("b")] * batch)
    assert [c.text for c in out] == ["chunked ok"] * 2 * batch
    assert server.connections == batch  # kept alive across chunked responses


@BOTH_PATHS
def test_http_client_connection_close_and_read_to_eof(batch):
    def respond(body):
        data = _json_bytes(body, body["messages"][-1]["content"])
        if body["messages"][-1]["content"] == "eof":  # no length at all: the body ends at close
            return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n" + data
        return b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(data), data)

    with RawServer(respond, close_after=True) as server, OpenAIPolicy("m", base_url=server.base_url) as policy:
        texts = [c.text for c in policy.generate([_request("eof")] * batch) + policy.generate([_request("x")] * batch)]
    assert texts == ["eof"] * batch + ["x"] * batch
    assert server.connections == 2 * batch


@BOTH_PATHS
def test_http_client_reconnects_when_idle_connection_was_dropped(batch):
    """The server drops each connection after answering, without ``connection: close``: the
    next request on that (reused) connection fails unsent, and goes out on a fresh one."""

    def respond(body):
        data = _json_bytes(body)
        return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(data), data)

    with RawServer(respond, close_after=True) as server:
        with OpenAIPolicy("m", base_url=server.base_url, max_retries=0) as policy:
            for _ in range(3):
                out = policy.generate([_request()] * batch)
                assert [c.text for c in out] == ["ok"] * batch
                time.sleep(0.05)  # let the close reach us
            assert policy.retries == 0
    assert server.requests == 3 * batch


@BOTH_PATHS
def test_http_client_garbage_answer_is_a_transport_failure(batch):
    with RawServer(lambda body: b"SSH-2.0-OpenSSH\r\n\r\n", close_after=True) as server:
        with OpenAIPolicy("m", base_url=server.base_url, max_retries=1, retry_backoff=0.001) as policy:
            with pytest.raises(PolicyBackendError, match="(?i)bad ?status ?line") as info:  # not HTTP: both clients say so
                policy.generate([_request()] * batch)
    assert info.value.retryable and info.value.attempts == 2
    assert set(info.value.failures) == set(range(batch))


def test_lone_and_batched_paths_agree_and_injected_transports_use_httpx():
    from agentgym_lightning.policies._http import AiohttpTransport, HttpxTransport

    with MockOpenAIServer() as server:
        with (
            OpenAIPolicy("m", base_url=server.base_url) as sync_single,
            OpenAIPolicy("m", base_url=server.base_url, sync_single=False) as looped,
        ):
            assert isinstance(sync_single._http, AiohttpTransport) and sync_single._sync_replicas is not None
            assert looped._sync_replicas is None
            assert [c.completion_token_ids for c in sync_single.generate([_request("x")])] == [
                c.completion_token_ids for c in looped.generate([_request("x")])
            ]
    with _policy(Recorder(lambda body: (200, default_reply(body)))) as injected:
        assert isinstance(injected._http, HttpxTransport)


def test_a_proxy_from_the_environment_is_used(monkeypatch):
    from agentgym_lightning.policies._http import env_proxy

    monkeypatch.setenv("HTTP_PROXY", "http://proxy.test:3128")
    monkeypatch.setenv("NO_PROXY", "localhost")
    assert env_proxy("http://upstream.test/v1") == "http://proxy.test:3128"
    assert env_proxy("http://localhost:8000/v1") is None
    with OpenAIPolicy("m", base_url="http://upstream.test/v1") as policy:
        assert policy._http.proxy == "http://proxy.test:3128" and policy._sync_replicas is None


# --------------------------------------------------------------------------- concurrency


def test_256_concurrent_requests_all_in_flight_at_the_upstream():
    """Every request of a 256-batch reaches the upstream at once: the mock holds each request
    until 256 are in flight (a client capped at 100 connections would time out here)."""
    n = 256
    with MockOpenAIServer(hold_until=n, hold_timeout=30.0) as server:
        with OpenAIPolicy("m", base_url=server.base_url) as policy:
            start = time.monotonic()
            out = policy.generate([_request(f"q{i}") for i in range(n)])
            elapsed = time.monotonic() - start
        stats = server.state.stats()
    assert len(out) == n and all(c.text == "ok" for c in out)
    assert stats["max_in_flight"] == n, stats
    assert stats["hold_timeouts"] == 0, stats
    assert policy.max_in_flight == n
    assert elapsed < 25.0


def test_concurrency_option_bounds_in_flight():
    with MockOpenAIServer(delay=0.02) as server:
        with OpenAIPolicy("m", base_url=server.base_url, concurrency=8) as policy:
            out = policy.generate([_request() for _ in range(40)])
        assert len(out) == 40
        assert server.state.max_in_flight <= 8 and policy.max_in_flight == 8


def test_concurrent_generate_calls_from_threads():
    with MockOpenAIServer() as server, OpenAIPolicy("m", base_url=server.base_url) as policy:
        results: list[list[Completion]] = []
        lock = threading.Lock()

        def worker(k: int) -> None:
            out = policy.generate([_request(f"t{k}-{i}") for i in range(5)])
            with lock:
                results.append(out)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert len(results) == 8 and all(len(r) == 5 for r in results)


async def _agenerate(policy: OpenAIPolicy) -> list[Completion]:
    return await policy.agenerate([_request("async")])


def test_agenerate():
    import asyncio

    with MockOpenAIServer() as server, OpenAIPolicy("m", base_url=server.base_url) as policy:
        (c,) = asyncio.run(_agenerate(policy))
    assert c.text == "ok"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- replicas


def _episode_request(episode: str, turn: int) -> ChatRequest:
    from agentgym_lightning.llm import EPISODE_KEY

    return ChatRequest(messages=[{"role": "user", "content": f"turn {turn}"}], metadata={EPISODE_KEY: episode})


@BOTH_PATHS
def test_replicas_share_the_load_sticky_per_episode_and_a_dead_one_leaves_rotation(batch):
    with MockOpenAIServer() as a, MockOpenAIServer() as b:
        urls = [a.base_url, b.base_url]
        with OpenAIPolicy("m", base_url=urls, max_retries=0) as policy:
            episodes = [f"episode-{i}" for i in range(16)]
            replica_of = {}
            for turn in range(3):  # each episode's calls all land on one replica
                for i in range(0, 16, batch):
                    before = (a.state.requests, b.state.requests)
                    policy.generate([_episode_request(e, turn) for e in episodes[i : i + batch]])
                    if batch == 1:
                        landed = 0 if a.state.requests > before[0] else 1
                        assert replica_of.setdefault(episodes[i], landed) == landed
            assert a.state.requests + b.state.requests == 48 and min(a.state.requests, b.state.requests) >= 8
            b.stop()  # replica b dies: its episodes move to a at once, with no error
            out = policy.generate([_episode_request(e, 3) for e in episodes][: max(batch, 4)])
            assert all(c.text == "ok" for c in out)
            assert policy.replicas_in_rotation == [a.base_url]


def test_metadata_names_the_episode_for_the_policy_but_not_in_the_trajectory():
    from agentgym_lightning.env import AgentEnv
    from agentgym_lightning.llm import EPISODE_KEY
    from agentgym_lightning.rollouts.in_process import rollout

    seen = []

    def policy(requests):
        seen.extend(r.metadata.get(EPISODE_KEY) for r in requests)
        return [Completion(text="x") for _ in requests]

    def agent(task, ctx):
        ctx.chat_completion([{"role": "user", "content": "a"}])
        return ctx.chat_completion([{"role": "user", "content": "b"}]).text

    (t,) = rollout(lambda: AgentEnv(agent, [1], lambda *_: 1.0), policy, episodes=1, progress=False)
    assert seen == [t.episode_id, t.episode_id]
    assert all(EPISODE_KEY not in s.request.metadata for s in t.steps)


def test_submit_sends_each_call_as_it_comes():
    """submit (the driver's path): a call is sent the moment it is submitted, not gathered into a
    batch; the server sees the first call on its own (it holds each until two are in flight),
    then the second joins it and both are answered. vllm-server is this backend (same submit)."""
    from agentgym_lightning.policies.base import schedules_per_step
    from agentgym_lightning.policies.vllm_server import VLLMServerPolicy

    assert VLLMServerPolicy.submit is OpenAIPolicy.submit
    with MockOpenAIServer(hold_until=2, hold_timeout=20.0) as server, OpenAIPolicy("m", base_url=server.base_url) as policy:
        assert schedules_per_step(policy)
        first = policy.submit(_request("first"))
        deadline = time.monotonic() + 10
        while server.state.in_flight < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.state.in_flight == 1 and not first.done()  # sent alone, held by the server
        second = policy.submit(_request("second"))
        assert first.result(timeout=10).text == "ok" and second.result(timeout=10).text == "ok"
        stats = server.state.stats()
    assert stats["max_in_flight"] == 2 and stats["hold_timeouts"] == 0, stats


def test_submit_failure_is_the_calls_backend_error():
    def reply(body):
        return 400, {"error": {"message": "bad request", "type": "invalid_request_error"}}

    with _policy(Recorder(reply)) as policy:
        with pytest.raises(PolicyBackendError, match="bad request"):
            policy.submit(_request()).result(timeout=10)
    with pytest.raises(RuntimeError, match="closed"):
        policy.submit(_request())
