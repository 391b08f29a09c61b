"""What the ``openai`` backend's HTTP client costs per request, against the instant mock upstream.

    python bench/bench_openai_transport.py            # 2000 lone requests, 20 batches of 64
    python bench/bench_openai_transport.py --profile  # + cProfile of the lone-request path

The mock upstream runs in its own process (no GIL shared). Measured in one run, interleaved in
rounds so machine noise hits every path alike:

* **raw**: a bare keep-alive socket writing the request bytes and reading ``Content-Length``
  bytes back: the floor any client pays (the upstream's own time included);
* **policy, lone**: ``OpenAIPolicy.generate([request])`` (the path of a lone agent, the one
  whose latency counts): p50 and p90, and p50 minus raw's p50 = what the client adds;
* **policy, batch of 64**: ``generate`` of 64 requests at once (all in flight together):
  requests/s.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentgym_lightning.llm import ChatRequest, SamplingParams  # noqa: E402
from agentgym_lightning.testing.mock_openai_server import spawn_mock_server  # noqa: E402
from agentgym_lightning.policies.openai import OpenAIPolicy  # noqa: E402

MESSAGES = [{"role": "user", "content": "What is 6 * 7? Answer with the number."}]


class RawClient:
    """The floor: one blocking keep-alive socket, no parsing beyond Content-Length."""

    def __init__(self, url: str) -> None:
        host, port = url.split("//")[1].split("/")[0].split(":")
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.file = self.sock.makefile("rb")
        body = json.dumps({"model": "m", "messages": MESSAGES, "logprobs": True, "return_token_ids": True}).encode()
        self.payload = (
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode() + body

    def call(self) -> None:
        self.sock.sendall(self.payload)
        length = 0
        while (line := self.file.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        json.loads(self.file.read(length))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lone", type=int, default=2000, help="lone requests per path")
    parser.add_argument("--batches", type=int, default=20, help="batches of --batch-size")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds")
    parser.add_argument("--profile", action="store_true", help="cProfile the lone-request path (top 25 by own time)")
    args = parser.parse_args()

    proc, url = spawn_mock_server()
    try:
        base_url = f"{url}/v1"
        raw = RawClient(base_url)
        policy = OpenAIPolicy("m", base_url=base_url)
        request = ChatRequest(messages=MESSAGES, sampling=SamplingParams(max_tokens=8))
        lat: dict[str, list[float]] = {"raw": [], "lone": []}
        batch_s: list[float] = []
        for _ in range(50):  # warm-up: connections open, code paths hot
            raw.call()
            policy.generate([request])
        per_round = args.lone // args.rounds
        for _ in range(args.rounds):
            for _ in range(per_round):
                t = time.perf_counter()
                raw.call()
                lat["raw"].append(time.perf_counter() - t)
            for _ in range(per_round):
                t = time.perf_counter()
                policy.generate([request])
                lat["lone"].append(time.perf_counter() - t)
            for _ in range(max(1, args.batches // args.rounds)):
                t = time.perf_counter()
                policy.generate([request] * args.batch_size)
                batch_s.append(time.perf_counter() - t)

        def q(xs: list[float], p: float) -> float:
            return statistics.quantiles(xs, n=100)[int(p) - 1] * 1e3

        raw50, lone50 = statistics.median(lat["raw"]) * 1e3, statistics.median(lat["lone"]) * 1e3
        print(f"transport: {type(policy._http).__name__}")
        print(f"raw socket          p50 {raw50:.3f} ms   p90 {q(lat['raw'], 90):.3f} ms")
        print(f"policy, lone        p50 {lone50:.3f} ms   p90 {q(lat['lone'], 90):.3f} ms   added p50 {lone50 - raw50:.3f} ms")
        rps = args.batch_size / statistics.median(batch_s)
        print(f"policy, batch of {args.batch_size}  {rps:.0f} requests/s (median batch {statistics.median(batch_s) * 1e3:.1f} ms)")
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(per_round):
                policy.generate([request])
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(5):
                policy.generate([request] * args.batch_size)
            prof.disable()
            print("--- batches (the policy's I/O thread is profiled separately below when yappi is absent: own-thread only)")
            pstats.Stats(prof).sort_stats("tottime").print_stats(15)
        policy.close()
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
