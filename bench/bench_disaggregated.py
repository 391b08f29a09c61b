"""The disaggregated path: agents over HTTP -> our gateway -> ``openai`` backend -> an upstream.

    python bench/bench_disaggregated.py                     # 256 agents, the defaults below
    python bench/bench_disaggregated.py --agents 64 --calls 10
    python bench/bench_disaggregated.py --agent-client sdk   # agents use the openai SDK
    python bench/bench_disaggregated.py --agents-in-process  # agents as threads of the driver

Three processes, as in a real Training-Agent Disaggregation deployment:

* **upstream**: the instant mock OpenAI server (:mod:`agentgym_lightning.testing.mock_openai_server`),
  standing in for ``vllm serve``;
* **agents**: a runner process whose agents make chat calls, each on its own keep-alive
  connection, to the base URL their episode was given: by default with a lean HTTP client (aiohttp)
  (~0.2 ms of CPU a call), with ``--agent-client sdk`` through the ``openai`` SDK on a thread
  each (several ms of CPU a call here: with 256 agents on 2 cores the SDK itself is then the
  bottleneck, which is the agents' cost, not the path's);
* **driver**: this process: ``AgentEnv(transport="http")`` episodes (each one's agent callable
  just hands its base URL to the runner and waits), the gateway's HTTP server, ``rollout`` and
  ``OpenAIPolicy``. Each agent call crosses a real socket to the gateway, waits in its episode,
  is batched by ``rollout`` into one ``OpenAIPolicy.generate`` per round and goes out over a
  second socket to the upstream.

Stages, all in one run (latencies are measured inside the agents):

1. **direct**: one agent calls the upstream itself, ``--single-calls`` times.
2. **gateway, 1 agent**: the same calls through the full path. p50(2) - p50(1) is what the
   gateway path adds per call (target <= 1 ms). Throughput = calls / (last end - first start).
3. **concurrency proof**: ``--agents`` agents make one call each while the upstream holds every
   request until ``--agents`` are in flight at once (none may time out): every request of the
   round reaches the upstream concurrently (no client pool capping it at 100).
4. **gateway, N agents**: ``--agents`` agents at once, ``--calls`` calls each: throughput
   (target >= 90% of stage 2's).

Prints one line per stage (with the CPU each process spent per call, on Linux) and the ratios;
``--json PATH`` also writes them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import httpx  # noqa: E402

MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Say ok."},
]


# ------------------------------------------------------------------------------- the agents


_SSL_CONTEXT: Any = None


def openai_client(base_url: str, api_key: str) -> Any:
    """An agent's own OpenAI client (one connection), on a shared SSL context (httpx otherwise
    builds one per client, ~10 ms each)."""
    global _SSL_CONTEXT
    import ssl

    import openai

    if _SSL_CONTEXT is None:
        _SSL_CONTEXT = ssl.create_default_context()
    http = httpx.Client(timeout=None, trust_env=False, verify=_SSL_CONTEXT)
    return openai.OpenAI(base_url=base_url, api_key=api_key, http_client=http, max_retries=0)


def agent_loop(client: Any, model: str, calls: int) -> list[tuple[float, float]]:
    """The agent: ``calls`` chat calls in a row; the (start, end) of each."""
    spans = []
    for _ in range(calls):
        start = time.perf_counter()
        reply = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8)
        spans.append((start, time.perf_counter()))
        assert reply.choices[0].message.content is not None
    return spans


async def raw_agent_loop(base_url: str, api_key: str, model: str, calls: int, warmup: int) -> list[tuple[float, float]]:
    """The same agent as :func:`agent_loop` with a lean HTTP client (aiohttp, one keep-alive
    connection, ~0.2 ms of CPU a call) instead of the openai SDK (several ms a call here), so
    that the agents' own cost does not drown what is measured."""
    import aiohttp

    headers = {"content-type": "application/json", "authorization": f"Bearer {api_key}"}
    body = json.dumps({"model": model, "messages": MESSAGES, "max_tokens": 8}).encode()
    spans = []
    async with aiohttp.ClientSession(headers=headers, connector=aiohttp.TCPConnector(limit=1)) as http:
        for i in range(warmup + calls):
            start = time.perf_counter()
            async with http.post(f"{base_url}/chat/completions", data=body) as response:
                raw = await response.read()
                status = response.status
            end = time.perf_counter()
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {raw[:200]!r}")
            assert json.loads(raw)["choices"][0]["message"]["content"] is not None
            if i >= warmup:
                spans.append((start, end))
    return spans


def runner_main(client: str) -> None:
    """The agent runner process: one JSON job per stdin line, one JSON result per stdout line.

    A job ``{"id", "base_url", "api_key", "model", "calls", "warmup"}`` runs one agent: with the
    ``sdk`` client on a thread of its own, with the ``raw`` client as a task on one event loop.
    Its result is ``{"id", "spans"}`` or ``{"id", "error"}``. ``perf_counter`` is the system-wide
    monotonic clock, so spans compare across processes.
    """
    import asyncio

    out_lock = threading.Lock()

    def report(job: dict[str, Any], spans: list[tuple[float, float]] | None, error: BaseException | None) -> None:
        result: dict[str, Any] = {"id": job["id"]}
        if error is not None:
            result["error"] = f"{type(error).__name__}: {error}"
        else:
            result["spans"] = spans
        with out_lock:
            sys.stdout.write(json.dumps(result) + "\n")
            sys.stdout.flush()

    def run_sdk(job: dict[str, Any]) -> None:
        try:
            sdk = openai_client(job["base_url"], job["api_key"])
            agent_loop(sdk, job["model"], job.get("warmup", 0))
            spans = agent_loop(sdk, job["model"], job["calls"])
            sdk.close()
            report(job, spans, None)
        except Exception as exc:  # noqa: BLE001 - reported to the driver
            report(job, None, exc)

    async def run_raw(job: dict[str, Any]) -> None:
        try:
            spans = await raw_agent_loop(job["base_url"], job["api_key"], job["model"], job["calls"], job.get("warmup", 0))
            report(job, spans, None)
        except Exception as exc:  # noqa: BLE001 - reported to the driver
            report(job, None, exc)

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    # Strong references to the running agents: a task waiting on a stream is otherwise only
    # weakly reachable (asyncio's client protocols hold their reader weakly) and can be
    # garbage-collected mid-call.
    running: set[Any] = set()
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        if client == "sdk":
            threading.Thread(target=run_sdk, args=(job,), daemon=True).start()
        else:
            fut = asyncio.run_coroutine_threadsafe(run_raw(job), loop)
            running.add(fut)
            fut.add_done_callback(running.discard)


class AgentRunner:
    """The driver's handle on the runner process: :meth:`run` blocks until the agent is done."""

    def __init__(self, client: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--agent-runner", "--agent-client", client],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._futures: dict[int, Future[list[tuple[float, float]]]] = {}
        self._lock = threading.Lock()
        self._next = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            result = json.loads(line)
            with self._lock:
                fut = self._futures.pop(result["id"])
            if "error" in result:
                fut.set_exception(RuntimeError(result["error"]))
            else:
                fut.set_result([tuple(s) for s in result["spans"]])

    def run(self, base_url: str, api_key: str, model: str, calls: int, warmup: int = 0) -> list[tuple[float, float]]:
        fut: Future[list[tuple[float, float]]] = Future()
        with self._lock:
            job_id, self._next = self._next, self._next + 1
            self._futures[job_id] = fut
            assert self.proc.stdin is not None
            self.proc.stdin.write(
                json.dumps(
                    {"id": job_id, "base_url": base_url, "api_key": api_key, "model": model, "calls": calls, "warmup": warmup}
                )
                + "\n"
            )
            self.proc.stdin.flush()
        return fut.result()

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.terminate()
        self.proc.wait(10)


# ------------------------------------------------------------------------------- measuring


@dataclass
class Stage:
    name: str
    agents: int
    calls: int
    p50_ms: float
    p90_ms: float
    seconds: float
    calls_per_s: float
    upstream_max_in_flight: int = 0
    upstream_hold_timeouts: int = 0
    #: CPU milliseconds per call spent by each process (driver, agents, upstream), Linux only.
    cpu_ms_per_call: dict[str, float] | None = None


class CallLog:
    """(start, end) of every LLM call the agents made, measured inside the agents."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float]] = []
        self._lock = threading.Lock()

    def extend(self, spans: Sequence[tuple[float, float]]) -> None:
        with self._lock:
            self.spans.extend(spans)

    def stage(self, name: str, agents: int, upstream: dict[str, Any] | None = None) -> Stage:
        lat = sorted((e - s) * 1e3 for s, e in self.spans)
        wall = max(e for _, e in self.spans) - min(s for s, _ in self.spans)
        upstream = upstream or {}
        return Stage(
            name=name,
            agents=agents,
            calls=len(lat),
            p50_ms=statistics.median(lat),
            p90_ms=lat[int(0.9 * (len(lat) - 1))],
            seconds=wall,
            calls_per_s=len(lat) / wall if wall > 0 else 0.0,
            upstream_max_in_flight=int(upstream.get("max_in_flight", 0)),
            upstream_hold_timeouts=int(upstream.get("hold_timeouts", 0)),
        )


def cpu_seconds(pid: int) -> float:
    """User+system CPU seconds of process ``pid`` so far (0.0 where /proc is unavailable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


class Upstream:
    """The mock upstream in its own process, and its control endpoints."""

    def __init__(self) -> None:
        from agentgym_lightning.testing.mock_openai_server import spawn_mock_server

        self.proc, self.url = spawn_mock_server()
        self.base_url = f"{self.url}/v1"
        self._http = httpx.Client(trust_env=False)

    def control(self, **settings: Any) -> dict[str, Any]:
        return self._http.post(f"{self.url}/control", json=settings).raise_for_status().json()

    def stats(self) -> dict[str, Any]:
        return self._http.get(f"{self.url}/stats").raise_for_status().json()

    def close(self) -> None:
        self._http.close()
        self.proc.terminate()
        self.proc.wait(10)


def run_direct(runner: AgentRunner | None, upstream: Upstream, calls: int) -> Stage:
    """One agent calling the upstream directly (same SDK, same request)."""
    log = CallLog()
    if runner is not None:
        log.extend(runner.run(upstream.base_url, "x", "mock", calls, warmup=20))
    else:
        client = openai_client(upstream.base_url, "x")
        agent_loop(client, "mock", 20)
        log.extend(agent_loop(client, "mock", calls))
        client.close()
    return log.stage("direct", 1)


def run_gateway(
    policy: Any, upstream: Upstream, runner: AgentRunner | None, *, agents: int, calls: int, name: str, hold: bool = False
) -> Stage:
    """``agents`` episodes at once through AgentEnv(transport="http") + rollout + the policy."""
    from agentgym_lightning.env import AgentEnv
    from agentgym_lightning.rollouts.in_process import rollout

    log = CallLog()
    print(f"... {name}: {agents} agents x {calls} calls", file=sys.stderr, flush=True)

    def agent(task: Any, ctx: Any) -> None:
        if runner is not None:  # the agent lives in the runner process; we just wait for it
            log.extend(runner.run(ctx.base_url, ctx.api_key, ctx.model, calls))
        else:
            client = openai_client(ctx.base_url, ctx.api_key)
            log.extend(agent_loop(client, ctx.model, calls))
            client.close()

    def factory() -> AgentEnv:
        return AgentEnv(agent, tasks=list(range(agents)), transport="http", time_limit=None)

    upstream.control(reset=True, **({"hold_until": agents, "hold_timeout": 30.0} if hold else {}))
    pids = {"driver": os.getpid(), "upstream": upstream.proc.pid}
    if runner is not None:
        pids["agents"] = runner.proc.pid
    before = {k: cpu_seconds(p) for k, p in pids.items()}
    rollout(factory, policy, episodes=agents, concurrency=agents, progress=False)
    stage = log.stage(name, agents, upstream.stats())
    stage.cpu_ms_per_call = {k: (cpu_seconds(p) - before[k]) * 1e3 / max(stage.calls, 1) for k, p in pids.items()}
    return stage


def fmt(stage: Stage) -> str:
    extra = ""
    if stage.upstream_max_in_flight:
        extra = f", upstream max in flight {stage.upstream_max_in_flight} (hold time-outs {stage.upstream_hold_timeouts})"
    if stage.cpu_ms_per_call:
        extra += "; CPU ms/call " + ", ".join(f"{k} {v:.2f}" for k, v in stage.cpu_ms_per_call.items())
    return (
        f"{stage.name:<22} {stage.agents:4d} agents {stage.calls:6d} calls  p50 {stage.p50_ms:6.2f} ms  "
        f"p90 {stage.p90_ms:6.2f} ms  {stage.calls_per_s:8.1f} calls/s{extra}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=256, help="concurrent agents in stages 3-4")
    parser.add_argument("--calls", type=int, default=8, help="calls per agent in stage 4")
    parser.add_argument("--single-calls", type=int, default=400, help="calls in stages 1-2")
    parser.add_argument("--agents-in-process", action="store_true", help="run the agents as threads of this process (sdk)")
    parser.add_argument(
        "--agent-client",
        choices=["raw", "sdk"],
        default="raw",
        help="how runner agents call: a lean HTTP client, aiohttp (default) or the openai SDK, one thread per agent",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    parser.add_argument("--agent-runner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.agent_runner:
        runner_main(args.agent_client)
        return 0

    from agentgym_lightning.policies.openai import OpenAIPolicy

    upstream = Upstream()
    runner = None if args.agents_in_process else AgentRunner(args.agent_client)
    policy = OpenAIPolicy("mock", base_url=upstream.base_url)
    try:
        # Warm-up: gateway server, policy connections, SDK/JSON caches; not measured.
        run_gateway(policy, upstream, runner, agents=min(args.agents, 32), calls=4, name="warm-up")
        direct = run_direct(runner, upstream, args.single_calls)
        single = run_gateway(policy, upstream, runner, agents=1, calls=args.single_calls, name="gateway, 1 agent")
        proof = run_gateway(policy, upstream, runner, agents=args.agents, calls=1, name="concurrency proof", hold=True)
        many = run_gateway(policy, upstream, runner, agents=args.agents, calls=args.calls, name=f"gateway, {args.agents} agents")
    finally:
        policy.close()
        if runner is not None:
            runner.close()
        upstream.close()

    added = single.p50_ms - direct.p50_ms
    ratio = many.calls_per_s / single.calls_per_s if single.calls_per_s else 0.0
    all_in_flight = proof.upstream_max_in_flight == args.agents and proof.upstream_hold_timeouts == 0
    where = (
        "threads of this process (openai SDK)" if args.agents_in_process else f"in a runner process ({args.agent_client} client)"
    )
    print(f"agents: {where}; upstream: instant mock in its own process; {os.cpu_count()} CPUs")
    for stage in (direct, single, proof, many):
        print(fmt(stage))
    print(f"added per call at p50 (gateway 1 agent - direct): {added:.3f} ms (target <= 1 ms)")
    print(f"throughput {args.agents} agents / 1 agent: {ratio:.3f} (target >= 0.9)")
    print(
        f"all {args.agents} requests of a round in flight at the upstream at once: {all_in_flight} "
        f"(max {proof.upstream_max_in_flight}, hold time-outs {proof.upstream_hold_timeouts})"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "stages": [asdict(s) for s in (direct, single, proof, many)],
                    "added_ms_p50": added,
                    "throughput_ratio": ratio,
                    "all_in_flight": all_in_flight,
                    "agents_in_process": args.agents_in_process,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
