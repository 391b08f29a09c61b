"""What joining an agent's OpenTelemetry traces to its steps costs, measured in one run.

1. Per-span ingest over OTLP/HTTP: the router's ``post_traces`` (parse an export request of
   ``--batch`` spans recorded by the real SDK, protobuf and JSON, and join them to an episode's
   steps), per span; the HTTP server's own cost is not included.
2. Per-span cost in-process: the SDK starting and ending a span inside an episode's trace (our
   processor hands it to the episode, at its start and its end) versus outside any episode (the
   processor only looks the trace up): the difference is ours.
3. Per-call overhead with tracing on vs off (``AGENTGYM_LIGHTNING_TRACING``): the process's CPU
   time (every thread) per env step (instant scripted policy) for an agent that traces nothing, and for one that wraps its run in
   an agent span and runs a traced tool after every call; rounds of each setting interleaved.

    python bench/bench_tracing.py [--spans 5000] [--calls 500] [--rounds 15] [--batch 100]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentgym_lightning import Completion
from agentgym_lightning.env import AgentEnv
from agentgym_lightning.episode import Episode
from agentgym_lightning.gateway.otlp import otlp_json
from agentgym_lightning.gateway.router import EpisodeRouter
from agentgym_lightning.llm import ChatRequest, ToolCall
from agentgym_lightning.tracing import processor

CALL = Completion(text="", tool_calls=[ToolCall(id="call_1", name="calculator", arguments="{}")])
TOOL_ATTRS = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "calculator",
              "gen_ai.tool.call.id": "call_1", "gen_ai.tool.call.arguments": '{"expression": "2+3"}',
              "gen_ai.tool.call.result": "5"}


def recorded_spans(n: int) -> list:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("bench")
    for _ in range(n):
        with tracer.start_as_current_span("execute_tool calculator", attributes=TOOL_ATTRS):
            pass
    return list(exporter.get_finished_spans())


def episode_with_calls(calls: int, max_spans: int) -> Episode:
    episode = Episode(task=None, max_spans=max_spans)
    for _ in range(calls):
        call = episode.submit(ChatRequest(messages=[{"role": "user", "content": "hi"}]))
        episode.answer(call, CALL)
    return episode


def ingest(spans: list, batch: int) -> dict[str, float]:
    router = EpisodeRouter()
    out = {}
    bodies = {
        "application/x-protobuf": [encode_spans(spans[i : i + batch]).SerializeToString() for i in range(0, len(spans), batch)],
        "application/json": [otlp_json(encode_spans(spans[i : i + batch])) for i in range(0, len(spans), batch)],
    }
    for media, chunks in bodies.items():
        episode = episode_with_calls(20, max_spans=len(spans))
        router.register(episode)
        t = time.process_time()
        for body in chunks:
            router.post_traces(episode.episode_id, body, media)
        out[media] = (time.process_time() - t) / len(spans)
        assert len(episode.trajectory.spans) == len(spans)
    return out


def in_process(n: int) -> tuple[float, float]:
    processor.PROCESSOR.install()
    tracer = trace.get_tracer("bench")
    episode = episode_with_calls(20, max_spans=n)

    def spans() -> float:
        t = time.process_time()
        for _ in range(n):
            with tracer.start_as_current_span("execute_tool calculator", attributes=TOOL_ATTRS):
                pass
        return (time.process_time() - t) / n

    outside = spans()
    with processor.episode_trace(episode):
        inside = spans()
    assert len(episode.trajectory.spans) == n
    return inside, outside


def plain_agent(task, ctx):
    for _ in range(task["calls"]):
        ctx.chat_completion([{"role": "user", "content": "hi"}])


def traced_agent(task, ctx):
    tracer = trace.get_tracer("agent")
    with tracer.start_as_current_span("invoke_agent solver", attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "solver"}):
        for _ in range(task["calls"]):
            ctx.chat_completion([{"role": "user", "content": "hi"}])
            with tracer.start_as_current_span("execute_tool calculator", attributes=TOOL_ATTRS):
                pass


def per_call(agent, calls: int, tracing: bool) -> float:
    os.environ[processor.DISABLE_ENV] = "1" if tracing else "0"
    env = AgentEnv(agent, [{"calls": calls}], lambda t, r: 0.0, max_turns=None, time_limit=None)
    try:
        env.reset(seed=0)
        t = time.process_time()  # every thread's CPU: the agent's and the driver's
        done = False
        while not done:
            *_, terminated, truncated, _info = env.step(CALL)
            done = terminated or truncated
        return (time.process_time() - t) / calls
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spans", type=int, default=5000)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()

    spans = recorded_spans(args.spans)
    cost = ingest(spans, args.batch)
    print(f"1. OTLP ingest, {args.spans} tool spans in requests of {args.batch} (parse + join), CPU per span:")
    for media, seconds in cost.items():
        print(f"   {media:24s} {seconds * 1e6:7.1f} us")
    inside, outside = in_process(args.spans)
    print(f"2. in-process span (start+end, SDK included): in an episode {inside * 1e6:.1f} us, outside {outside * 1e6:.1f} us;"
          f" ours {max(0.0, inside - outside) * 1e6:.1f} us per span ({inside / outside:.2f}x)")
    results: dict[tuple[str, bool], list[float]] = {}
    for _ in range(args.rounds):
        for name, agent in (("plain", plain_agent), ("traced", traced_agent)):
            for tracing in (False, True):
                results.setdefault((name, tracing), []).append(per_call(agent, args.calls, tracing))
    print(f"3. CPU per call (env.step, instant policy, {args.calls} calls x {args.rounds} rounds, median of rounds):")
    for name in ("plain", "traced"):
        off = statistics.median(results[(name, False)])
        on = statistics.median(results[(name, True)])
        print(f"   {name:6s} agent: tracing off {off * 1e6:7.1f} us, on {on * 1e6:7.1f} us, on/off {on / off:.2f}x"
              f" (+{(on - off) * 1e6:.1f} us)")
    os.environ.pop(processor.DISABLE_ENV, None)


if __name__ == "__main__":
    main()
