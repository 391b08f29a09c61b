"""The agent's own OpenTelemetry traces joined to its steps, with the real OTel SDK and OTLP
exporter and no network: in-process (the span processor), over OTLP/HTTP (protobuf and JSON),
and bad or hostile OTLP payloads refused whole."""

from __future__ import annotations

import gzip
import json

import httpx
import pytest

pytest.importorskip("opentelemetry.sdk", reason="needs the [tracing] extra")

from opentelemetry import trace  # noqa: E402
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from agentgym_lightning.env import AgentEnv  # noqa: E402
from agentgym_lightning.gateway.gateway import Gateway  # noqa: E402
from agentgym_lightning.gateway.otlp import otlp_json  # noqa: E402
from agentgym_lightning.llm import Completion, ToolCall  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object", "properties": {}}}}]
CALL = Completion(text="", tool_calls=[ToolCall(id="call_1", name="calculator", arguments="{}")])


def traced_agent(tracer_of):
    """An agent that traces itself as the GenAI conventions say: an agent span around its calls,
    a tool span (that fails) between them. ``tracer_of(ctx)`` gives the tracer."""

    def agent(task, ctx):
        tracer = tracer_of(ctx)
        client = ctx.openai_client()
        messages = [{"role": "user", "content": task}]
        with tracer.start_as_current_span(
            "invoke_agent solver", attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "solver"}
        ):
            reply = client.chat.completions.create(model=ctx.model, messages=messages, tools=TOOLS)
            call = reply.choices[0].message.tool_calls[0]
            with tracer.start_as_current_span(
                "execute_tool calculator",
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "calculator",
                    "gen_ai.tool.call.id": call.id,
                    "gen_ai.tool.call.arguments": "{}",
                },
            ) as span:
                try:
                    raise ZeroDivisionError("division by zero")
                except ZeroDivisionError as exc:
                    span.record_exception(exc)
                    span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
            messages += [reply.choices[0].message.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": call.id, "content": "error"}]
            return client.chat.completions.create(model=ctx.model, messages=messages).choices[0].message.content

    return agent


def run_episode(agent, **kwargs):
    env = AgentEnv(agent, ["1/0?"], lambda task, result: 1.0, air_weights={"otel.tool_error": -0.5}, **kwargs)
    try:
        env.reset(seed=0)
        env.step(CALL)
        *_, info = env.step("done")
        return info["trajectory"]
    finally:
        env.close()


def _check_joined(trajectory):
    first, second = trajectory.steps
    assert [first.agent, second.agent] == ["solver", "solver"]  # from the agent span, no metadata
    (tool,) = first.outcome["otel.tools"]  # a semantic variable of the step that asked for the tool
    assert tool["name"] == "calculator" and tool["call_id"] == "call_1" and tool["arguments"] == "{}"
    assert tool["status"] == "error" and tool["error"] == "division by zero" and tool["duration_s"] >= 0
    assert first.outcome["otel.tool_error"] == 1 and "otel.tool_error" not in second.outcome
    assert "otel.tool_ok" not in first.outcome
    # ... and an AIR signal air_weights weighs like any other.
    assert [(r.source, r.value, r.raw) for r in first.rewards] == [("otel.tool_error", -0.5, 1.0)]
    assert trajectory.total_reward == pytest.approx(0.5)
    kinds = {s["kind"]: s for s in trajectory.spans}
    assert kinds["tool"]["step"] == 0 and kinds["agent"]["name"] == "invoke_agent solver"


def test_in_process_spans_reach_their_episode_with_no_exporter():
    trajectory = run_episode(traced_agent(lambda ctx: trace.get_tracer("agent")))
    _check_joined(trajectory)
    # The episode ran in its own trace: its id is the episode id.
    assert isinstance(trace.get_tracer_provider(), TracerProvider)


def test_otlp_http_protobuf_from_the_real_exporter():
    """An agent elsewhere points the SDK's own OTLP/HTTP exporter at its episode."""

    def tracer_of(ctx):
        provider = TracerProvider()  # the agent's own, as in another process
        endpoint = ctx.base_url.removesuffix("/v1") + "/v1/traces"
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        return provider.get_tracer("agent")

    trajectory = run_episode(traced_agent(tracer_of), transport="http")
    _check_joined(trajectory)


def _export_body(spans) -> bytes:
    return encode_spans(spans).SerializeToString()


def _recorded_spans():
    """Spans the real SDK recorded of ``traced_agent``'s shape, outside any episode."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("execute_tool calculator", attributes={
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "calculator"}) as span:
        span.set_status(trace.Status(trace.StatusCode.ERROR, "boom"))
    return exporter.get_finished_spans()


@pytest.fixture()
def gateway_episode():
    """A gateway with a token, and an episode that made one answered call."""
    from agentgym_lightning.episode import Episode
    from agentgym_lightning.llm import ChatRequest

    gateway = Gateway(token="secret")
    episode = Episode(task=None)
    gateway.register(episode)
    call = episode.submit(ChatRequest(messages=[{"role": "user", "content": "hi"}]))
    episode.answer(call, CALL)
    with httpx.Client(base_url=gateway.base_url(episode.episode_id).removesuffix("/v1"),
                      headers={"authorization": "Bearer secret"}) as client:
        yield gateway, episode, client
    gateway.close()


@pytest.mark.parametrize("encoding", ["protobuf", "json", "gzip"])
def test_otlp_http_encodings(gateway_episode, encoding):
    _, episode, client = gateway_episode
    spans = _recorded_spans()
    if encoding == "json":
        body, headers = otlp_json(encode_spans(spans)), {"content-type": "application/json"}
    else:
        body, headers = _export_body(spans), {"content-type": "application/x-protobuf"}
    if encoding == "gzip":
        body, headers = gzip.compress(body), {**headers, "content-encoding": "gzip"}
    response = client.post("/v1/traces", content=body, headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith(headers["content-type"])
    step = episode.trajectory.steps[0]
    assert step.outcome["otel.tool_error"] == 1 and step.outcome["otel.tools"][0]["error"] == "boom"
    # An exporter's retry of the same spans is not counted twice.
    assert client.post("/v1/traces", content=body, headers=headers).status_code == 200
    assert step.outcome["otel.tool_error"] == 1 and len(episode.trajectory.spans) == 1


def _gzip_bomb(size: int) -> bytes:
    return gzip.compress(b"\0" * size)


@pytest.mark.parametrize(
    "body, headers, status",
    [
        (b"\xff\xff\xff\xff garbage", {"content-type": "application/x-protobuf"}, 400),
        (b"{\"resourceSpans\": [{\"scopeSpans\": [{\"spans\": [{\"traceId\": \"zz\"}]}]}]}",
         {"content-type": "application/json"}, 400),
        (b"{\"resourceSpans\": 5}", {"content-type": "application/json"}, 400),
        (b"[1, 2]", {"content-type": "application/json"}, 400),
        (b"{\"resourceSpans\": [{\"scopeSpans\": [{\"spans\": [{\"traceId\": \"00\", \"spanId\": \"01\"}]}]}]}",
         {"content-type": "application/json"}, 400),  # ids of the wrong length
        (b"{}", {"content-type": "text/plain"}, 415),
        (b"{}", {"content-type": "application/json", "content-encoding": "br"}, 415),
        (b"not gzip", {"content-type": "application/x-protobuf", "content-encoding": "gzip"}, 400),
        (_gzip_bomb(9 * 2**20), {"content-type": "application/x-protobuf", "content-encoding": "gzip"}, 413),
        (b"\0" * (8 * 2**20 + 1), {"content-type": "application/x-protobuf"}, 413),
        (b"\n" * 200, {"content-type": "application/x-protobuf"}, 400),  # nesting past protobuf's limit
    ],
    ids=["garbage-protobuf", "bad-hex", "not-a-list", "not-an-object", "short-ids", "media-type", "encoding",
         "corrupt-gzip", "gzip-bomb", "too-large", "deep"],
)
def test_bad_or_hostile_otlp_gets_4xx_and_changes_nothing(gateway_episode, body, headers, status):
    _, episode, client = gateway_episode
    good = _export_body(_recorded_spans())
    before = (json.dumps(episode.trajectory.steps[0].outcome), list(episode.trajectory.spans))
    response = client.post("/v1/traces", content=body, headers=headers)
    assert response.status_code == status, response.text
    assert "error" in response.json()
    assert (json.dumps(episode.trajectory.steps[0].outcome), episode.trajectory.spans) == before
    # A valid request with a bad one's tail is refused whole.
    if status == 400 and headers["content-type"] == "application/x-protobuf" and "content-encoding" not in headers:
        assert client.post("/v1/traces", content=good + body, headers=headers).status_code == 400
        assert episode.trajectory.spans == before[1]


def test_otlp_needs_the_token_and_a_running_episode(gateway_episode):
    gateway, episode, client = gateway_episode
    body, headers = _export_body(_recorded_spans()), {"content-type": "application/x-protobuf"}
    assert client.post("/v1/traces", content=body, headers={**headers, "authorization": "Bearer wrong"}).status_code == 401
    url = gateway.base_url("nope").removesuffix("/v1") + "/v1/traces"
    assert client.post(url, content=body, headers=headers).status_code == 404
    assert episode.trajectory.spans == [] and "otel.tools" not in episode.trajectory.steps[0].outcome


def test_spans_kept_on_the_trajectory_are_bounded():
    from agentgym_lightning.episode import Episode
    from agentgym_lightning.tracing.spans import MAX_VALUE_CHARS, SpanRecord

    episode = Episode(task=None, max_spans=3)
    records = [
        SpanRecord.build(trace_id="0" * 32, span_id=f"{i:016x}", parent_id=None, name="x" * 10_000, start=1.0, end=2.0,
                         attributes=[(f"a{j}", "v" * 10_000) for j in range(100)])
        for i in range(1, 6)
    ]
    episode.record_spans(records)
    spans = episode.trajectory.spans
    assert len(spans) == 3 and episode.trajectory.spans_dropped == 2
    assert len(spans[0]["attributes"]) == 64 and all(len(v) == MAX_VALUE_CHARS for v in spans[0]["attributes"].values())
    assert len(spans[0]["name"]) == MAX_VALUE_CHARS
    # ...and travel with the trajectory's JSONL.
    from agentgym_lightning.trajectory import Trajectory

    back = Trajectory.from_dict(json.loads(episode.trajectory.to_json()))
    assert back.spans == spans and back.spans_dropped == 2


def test_agent_match_selects_by_the_traced_agent_name_even_when_it_arrives_late():
    """Over OTLP the agent span arrives when the agent ends, after its calls: agent_match is
    applied again at the episode's end, with the names the traces gave."""

    def tracer_of(ctx):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=ctx.base_url.removesuffix("/v1") + "/v1/traces")))
        return provider.get_tracer("agent")

    trajectory = run_episode(traced_agent(tracer_of), transport="http", agent_match="solver")
    assert [s.agent for s in trajectory.steps] == ["solver", "solver"]
    assert [s.trainable for s in trajectory.steps] == [True, True]
    trajectory = run_episode(traced_agent(tracer_of), transport="http", agent_match="writer")
    assert [s.trainable for s in trajectory.steps] == [False, False]


@pytest.fixture()
def otlp_collector():
    """A stand-in OTLP/HTTP collector on 127.0.0.1: the export requests it received."""
    import http.server
    import threading

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    received = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the stdlib's name
            body = self.rfile.read(int(self.headers["content-length"]))
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            received.append((self.path, request))
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", received
    server.shutdown()
    server.server_close()


def test_episodes_exported_as_genai_spans(otlp_collector, monkeypatch):
    from agentgym_lightning.plugins import otel_exporter

    endpoint, received = otlp_collector
    monkeypatch.setenv(otel_exporter.ENDPOINT_ENV, endpoint)
    trajectory = run_episode(traced_agent(lambda ctx: trace.get_tracer("agent")), env_id="demo/Calc-v0")
    assert otel_exporter.exporter().flush()
    spans = [(span, path) for path, request in received for rs in request.resource_spans
             for ss in rs.scope_spans for span in ss.spans]
    assert {path for _, path in spans} == {"/v1/traces"}
    by_name = {span.name: span for span, _ in spans}
    root = by_name["invoke_agent demo/Calc-v0"]
    assert root.trace_id.hex() == trajectory.episode_id  # one episode, one trace: its id
    chats = [span for span, _ in spans if span.name.startswith("chat ")]
    assert len(chats) == 2 and all(c.parent_span_id == root.span_id for c in chats)
    attrs = [{kv.key: kv.value for kv in c.attributes} for c in chats]
    first = min(attrs, key=lambda a: a["agentgym.step.index"].int_value)
    assert first["gen_ai.operation.name"].string_value == "chat"
    assert first["gen_ai.agent.name"].string_value == "solver"
    assert first["agentgym.reward.otel.tool_error"].double_value == -0.5
    root_attrs = {kv.key: kv.value for kv in root.attributes}
    assert root_attrs["agentgym.total_reward"].double_value == pytest.approx(0.5)
    assert root_attrs["agentgym.status"].string_value == "succeeded"


def test_no_export_unless_an_endpoint_is_set(otlp_collector, monkeypatch):
    from agentgym_lightning.plugins import otel_exporter

    monkeypatch.delenv(otel_exporter.ENDPOINT_ENV, raising=False)
    run_episode(traced_agent(lambda ctx: trace.get_tracer("agent")))
    assert otel_exporter.exporter() is None and otlp_collector[1] == []


@pytest.mark.parametrize("agent, protocol", [("scratch", "tools"), ("scratch", "text"), ("autogen", "tools")])
def test_math_agents_trace_their_calculator_and_a_failure_is_air(agent, protocol):
    """The bundled math agents trace each calculator call as a GenAI tool span (AutoGen: its own
    span, given the calculator's error status): ``otel.tool_error`` is AIR with no math plugin."""
    if agent == "autogen":
        pytest.importorskip("autogen_agentchat", reason="needs the [autogen] extra")
    from agentgym_lightning.envs.math.env import calculator_policy, make_arithmetic_env

    env = make_arithmetic_env(difficulty=2, split="test", agent=agent, protocol=protocol,
                              air_weights={"otel.tool_error": -0.25})

    def policy(obs, task):  # a calculator call that fails, then an answer
        return calculator_policy(obs, {"expression": "1/0"})

    try:
        obs, info = env.reset(seed=0, options={"task_index": 0})
        done = False
        while not done:
            obs, _, terminated, truncated, info = env.step(policy(obs, info.get("task") or env.trajectory.task))
            done = terminated or truncated
    finally:
        env.close()
    steps = info["trajectory"].steps
    assert [t["status"] for t in steps[0].outcome["otel.tools"]] == ["error"]
    assert steps[0].outcome["otel.tools"][0]["name"] == "calculator"
    assert [(r.source, r.value) for r in steps[0].rewards] == [("otel.tool_error", -0.25)]
    assert "otel.tools" not in steps[1].outcome and not steps[1].rewards


def test_llm_spans_join_their_calls_by_order_and_name_them_through_their_agent():
    """No trace context on the calls (an exporter elsewhere): the n-th LLM span is the n-th call,
    and the agent span above it names it; failures of other spans count where they happened."""
    from agentgym_lightning.episode import Episode
    from agentgym_lightning.llm import ChatRequest
    from agentgym_lightning.tracing.spans import SpanRecord

    episode = Episode(task=None)
    for _ in range(2):
        episode.answer(episode.submit(ChatRequest(messages=[{"role": "user", "content": "hi"}])), CALL)
    first, second = episode.trajectory.steps
    t0, t1 = first.timings.answered_at, second.timings.answered_at

    def span(span_id, parent, start, end, **attrs):
        events = attrs.pop("events", ())
        status = attrs.pop("status", "unset")
        return SpanRecord.build(trace_id="ab" * 16, span_id=span_id, parent_id=parent, name=span_id, start=start, end=end,
                                attributes=attrs.items(), status=status, events=events)

    llm = {"gen_ai.operation.name": "chat"}
    episode.record_spans([
        span("00000000000000b2", "00000000000000a1", t0 + 1e-6, t1, **llm),  # sent out of order
        span("00000000000000b1", "00000000000000a1", 1.0, t0, **llm),
        # The agent span's times hold neither call: only the LLM spans can name them.
        span("00000000000000a1", None, 2e9, 2e9 + 1, **{"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "writer"}),
        span("00000000000000c1", None, t1, t1 + 1, events=[("exception", {"exception.type": "KeyError", "exception.message": "x"})]),
        span("00000000000000c2", None, t0, t0, status="error"),
    ])
    assert [first.agent, second.agent] == ["writer", "writer"]
    steps_of = {s["span_id"]: s["step"] for s in episode.trajectory.spans}
    assert steps_of["00000000000000b1"] == 0 and steps_of["00000000000000b2"] == 1
    assert second.outcome["otel.exception"] == 1 and first.outcome["otel.error"] == 1
    assert "otel.exception" not in first.outcome and "otel.error" not in second.outcome
    # A hostile exporter's parent loop ends the walk; nothing is named by it.
    episode.record_spans([span("00000000000000d1", "00000000000000d2", 1.0, 2.0),
                          span("00000000000000d2", "00000000000000d1", 1.0, 2.0)])
    assert len(episode.trajectory.spans) == 7
    # Clocks that disagree (times hold no call): by order, the n-th LLM span is the n-th call.
    skewed = Episode(task=None)
    for _ in range(2):
        skewed.answer(skewed.submit(ChatRequest(messages=[{"role": "user", "content": "hi"}])), CALL)
    skewed.record_spans([span("00000000000000e2", None, 20.0, 21.0, **llm), span("00000000000000e1", None, 10.0, 11.0, **llm)])
    assert {s["span_id"]: s["step"] for s in skewed.trajectory.spans} == {"00000000000000e2": 1, "00000000000000e1": 0}


def test_max_episode_spans_from_the_environment():
    from agentgym_lightning.gateway.limits import GatewayLimits

    limits = GatewayLimits.from_env({"AGENTGYM_LIGHTNING_GATEWAY_MAX_EPISODE_SPANS": "7"})
    assert limits.max_episode_spans == 7 and isinstance(limits.max_episode_spans, int)


def test_in_process_llm_spans_join_the_call_made_inside_them():
    """An LLM span current while the agent calls (an instrumented client) is that call, exactly:
    the call records the span it was made inside."""

    def agent(task, ctx):
        tracer = trace.get_tracer("agent")
        client = ctx.openai_client()
        for _ in range(2):
            with tracer.start_as_current_span("chat policy", attributes={"gen_ai.operation.name": "chat"}):
                client.chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": task}])

    env = AgentEnv(agent, ["hi"], lambda task, result: 0.0)
    try:
        env.reset(seed=0)
        env.step("a")
        *_, info = env.step("b")
    finally:
        env.close()
    llm = [s for s in info["trajectory"].spans if s["kind"] == "llm"]
    assert sorted(s["step"] for s in llm) == [0, 1]
    assert all(s["parent_id"] == format(int(info["trajectory"].episode_id[16:], 16), "016x") for s in llm)


def test_processor_installed_once_when_episodes_start_together():
    """Many episodes starting at once in a fresh process: one provider is set, and the
    processor is on it once (not once per thread, each span handled twice)."""
    import subprocess
    import sys

    script = """
import threading
from opentelemetry import trace
from agentgym_lightning.tracing import processor
barrier = threading.Barrier(8)
def go():
    barrier.wait()
    processor.PROCESSOR.install()
threads = [threading.Thread(target=go) for _ in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
provider = trace.get_tracer_provider()
print(sum(p is processor.PROCESSOR for p in provider._active_span_processor._span_processors))
"""
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
        assert done.stdout.strip() == "1" and "Overriding" not in done.stderr, done.stderr


def test_the_join_reads_the_record_and_the_episode_writes_what_it_finds():
    """SpanJoin only finds (agent names, outcome entries, span summaries); the episode writes."""
    import copy

    from agentgym_lightning.episode import Episode
    from agentgym_lightning.llm import ChatRequest
    from agentgym_lightning.tracing.join import SpanJoin
    from agentgym_lightning.tracing.spans import SpanRecord

    episode = Episode(task=None, max_spans=3)
    episode.answer(episode.submit(ChatRequest(messages=[{"role": "user", "content": "hi"}])), CALL)
    episode.emit_variable("otel.tool_ok", 2)  # the agent's own value: the join counts on from it
    at = episode.trajectory.steps[0].timings.answered_at

    def span(span_id, start=at, **attrs):
        status = attrs.pop("status", "unset")
        return SpanRecord.build(trace_id="ab" * 16, span_id=span_id, parent_id=None, name=span_id, start=start, end=at + 1,
                                attributes=attrs.items(), status=status)

    tool = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "calculator", "gen_ai.tool.call.id": "call_1"}
    records = [
        span("00000000000000a1", at - 10, **{"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "solver"}),
        span("00000000000000b1", **tool),
        span("00000000000000b2", **tool),
        span("00000000000000b3", status="error", **tool),
        span("00000000000000c1", status="error"),
    ]
    join = SpanJoin(episode.trajectory, max_spans=3)
    before = copy.deepcopy(episode.trajectory)
    found = join.add(records)
    assert episode.trajectory == before and episode.trajectory.spans == [] and episode.trajectory.steps[0].agent is None
    assert found.agents == {0: "solver"} and found.dropped == 2 and len(found.summaries) == 3
    assert found.outcomes[0]["otel.tool_ok"] == 4 and found.outcomes[0]["otel.tool_error"] == 1
    assert found.outcomes[0]["otel.error"] == 1 and len(found.outcomes[0]["otel.tools"]) == 3

    episode.record_spans(records)  # the episode's own join, and its writes
    (step,) = episode.trajectory.steps
    assert step.agent == "solver" and list(step.outcome) == ["otel.tool_ok", "otel.tools", "otel.tool_error", "otel.error"]
    assert {k: v for k, v in step.outcome.items() if k != "otel.tools"} == {"otel.tool_ok": 4, "otel.tool_error": 1, "otel.error": 1}
    assert len(episode.trajectory.spans) == 3 and episode.trajectory.spans_dropped == 2


def _bench_payloads():
    """The hostile-gateway bench's OTLP payload builders (``bench/hostile_gateway.py otlp``)."""
    import runpy
    from pathlib import Path

    bench = runpy.run_path(str(Path(__file__).resolve().parents[1] / "bench" / "hostile_gateway.py"))
    return bench["otlp_request"], bench["nested_kvlist"]


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_otlp_attribute_depth_and_value_counts_are_bounded_while_decoding(encoding):
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue

    from agentgym_lightning.episode import Episode
    from agentgym_lightning.gateway.limits import GatewayLimits
    from agentgym_lightning.gateway.otlp import parse_export_request

    _export_with, _nested_kvlist = _bench_payloads()
    limits = GatewayLimits(max_export_spans=10, max_attribute_values=100)
    flat = AnyValue()
    flat.array_value.values.extend(AnyValue(int_value=i) for i in range(100))
    cases = [
        (_export_with(attribute=_nested_kvlist(20)), 400, "max_attribute_depth"),  # 20 levels in ~150 bytes
        (_export_with(attribute=flat), 413, "max_attribute_values"),
        (_export_with(spans=11), 413, "max_export_spans"),
    ]
    for request, status, limit in cases:
        body = request.SerializeToString() if encoding == "protobuf" else otlp_json(request)
        media = "application/x-protobuf" if encoding == "protobuf" else "application/json"
        with pytest.raises(Exception) as err:
            parse_export_request(body, media, None, limits)
        assert getattr(err.value, "status", None) == status and limit in str(err.value), err.value
    # Within the bounds: a nested key-value list is one JSON object, not text escaped per level.
    (record,) = parse_export_request(_export_with(attribute=_nested_kvlist(15)).SerializeToString(), "application/x-protobuf",
                                     None, limits)
    assert len(record.attributes["a"]) < 200 and json.loads(record.attributes["a"])["k"]["k"]["k"]

    # Over HTTP, the router's limits apply: a 4xx, the episode unchanged.
    gateway = Gateway()
    episode = Episode(task=None)
    gateway.register(episode)
    with httpx.Client(base_url=gateway.base_url(episode.episode_id).removesuffix("/v1")) as client:
        body = _export_with(attribute=_nested_kvlist(20))
        body = body.SerializeToString() if encoding == "protobuf" else otlp_json(body)
        r = client.post("/v1/traces", content=body, headers={"content-type": media})
    assert r.status_code == 400 and "max_attribute_depth" in r.json()["error"]["message"]
    assert episode.trajectory.spans == []
    gateway.close()


def test_an_in_process_span_with_another_episodes_trace_id_is_not_that_episodes():
    """An agent that starts a span in a hand-built context carrying another episode's trace id
    (a failing tool span: an AIR signal) writes nothing to that episode."""
    import threading

    from opentelemetry.context import Context

    from agentgym_lightning.tracing.spans import episode_trace_id

    victim_ready, forged = threading.Event(), threading.Event()

    def victim(task, ctx):
        victim_ready.set()
        forged.wait(30)
        return ctx.openai_client().chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}]).id

    victim_env = AgentEnv(victim, ["v"], lambda t, r: 1.0, air_weights={"otel.tool_error": -0.5})
    holder = {}
    t = threading.Thread(target=lambda: holder.setdefault("reset", victim_env.reset(seed=0)))
    t.start()
    assert victim_ready.wait(10)

    def attacker(task, ctx):
        tracer = trace.get_tracer("attacker")
        fake_parent = trace.NonRecordingSpan(trace.SpanContext(
            trace_id=episode_trace_id(task), span_id=0xBAD, is_remote=False,
            trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED)))
        # Built on the agent's own current context, and on an empty one.
        for context in (trace.set_span_in_context(fake_parent), trace.set_span_in_context(fake_parent, Context())):
            with tracer.start_as_current_span("execute_tool calculator", context=context, attributes={
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "calculator"}) as span:
                span.set_status(trace.Status(trace.StatusCode.ERROR, "forged"))
        return "done"

    attacker_env = AgentEnv(attacker, [victim_env.episode_id], lambda t, r: 0.0)
    try:
        _, info = attacker_env.reset(seed=0)
    finally:
        forged.set()
        t.join(10)
        attacker_env.close()
    *_, info = victim_env.step("answer")
    victim_env.close()
    trajectory = info["trajectory"]
    assert trajectory.spans == [] and trajectory.steps[0].rewards == []
    assert "otel.tool_error" not in trajectory.steps[0].outcome and trajectory.total_reward == 1.0
