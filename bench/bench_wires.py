"""What each wire costs per call through the gateway, next to Chat Completions.

    python bench/bench_wires.py             # 300 calls per wire and path, 3 interleaved rounds

One agent per (wire, path) makes calls of the same conversation (a system prompt, a user turn,
one tool) and the env answers each at once with the same completion (token ids included), so
what is timed is the gateway and the client: the request read into the internal model, the
answer rendered in the wire's shape, and for the SDK path the official client building the
request and parsing the reply. Paths:

* **raw**: the episode's own httpx client posting the wire's JSON body (in-process: the
  gateway's own cost);
* **sdk**: the official SDK (``openai`` chat / responses / completions, ``anthropic`` messages),
  in-process;
* **sdk-http**: the same over a real socket to the gateway's HTTP server.

Printed: microseconds per call (median of the rounds) and the ratio to chat on the same path,
all measured in this one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentgym_lightning import Completion  # noqa: E402
from agentgym_lightning.env import AgentEnv  # noqa: E402

SYSTEM, USER = "You are a calculator. Answer with the number.", "What is 6 * 7?"
SCHEMA = {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}
ANSWER = Completion(text="42", prompt_token_ids=list(range(60)), completion_token_ids=[19, 20], logprobs=[-0.1, -0.2])

BODIES = {
    "chat": (
        "chat/completions",
        {
            "model": "m",
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}],
            "tools": [{"type": "function", "function": {"name": "calc", "parameters": SCHEMA}}],
        },
    ),
    "responses": (
        "responses",
        {
            "model": "m",
            "instructions": SYSTEM,
            "input": USER,
            "tools": [{"type": "function", "name": "calc", "parameters": SCHEMA, "strict": False}],
        },
    ),
    "completions": ("completions", {"model": "m", "prompt": f"{SYSTEM}\n{USER}\n", "max_tokens": 8}),
    "messages": (
        "messages",
        {
            "model": "m",
            "system": SYSTEM,
            "max_tokens": 8,
            "messages": [{"role": "user", "content": USER}],
            "tools": [{"name": "calc", "input_schema": SCHEMA}],
        },
    ),
}


def sdk_call(wire: str, ctx, http: bool):  # noqa: ANN001, ANN202 - bench helper
    """``call()`` making one call of ``wire`` with the official SDK."""
    if wire == "messages":
        import anthropic

        client = (
            anthropic.Anthropic(base_url=ctx.anthropic_base_url, api_key=ctx.api_key, max_retries=0)
            if http
            else ctx.anthropic_client()
        )
    else:
        import openai

        client = openai.OpenAI(base_url=ctx.base_url, api_key=ctx.api_key, max_retries=0) if http else ctx.openai_client()
    body = BODIES[wire][1]
    if wire == "chat":
        return lambda: client.chat.completions.create(**body)
    if wire == "responses":
        return lambda: client.responses.create(**body)
    if wire == "completions":
        return lambda: client.completions.create(**body)
    return lambda: client.messages.create(**body)


def per_call(wire: str, path: str, calls: int) -> float:
    """Seconds per call of one agent making ``calls`` calls (each answered at once)."""

    def agent(task, ctx):  # noqa: ANN001, ANN202
        if path == "raw":
            client, (route, body) = ctx.http_client(), BODIES[wire]
            url = f"{ctx.base_url_for_clients}/{route}"
            call = lambda: client.post(url, json=body).raise_for_status()  # noqa: E731
        else:
            call = sdk_call(wire, ctx, http=path == "sdk-http")
        for _ in range(calls):
            call()

    env = AgentEnv(agent, [{}], lambda t, r: 0.0, max_turns=calls + 1, transport="http" if path == "sdk-http" else "inproc")
    env.reset(seed=0)
    start = time.perf_counter()
    for _ in range(calls - 1):
        env.step(ANSWER)
    elapsed = time.perf_counter() - start
    *_, info = env.step(ANSWER)
    assert info["status"] == "succeeded", info.get("error")
    env.close()
    return elapsed / (calls - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    paths = ("raw", "sdk", "sdk-http")
    times: dict[tuple[str, str], list[float]] = {(w, p): [] for w in BODIES for p in paths}
    for wire in BODIES:  # warm-up: validators and SDK imports built once, outside the timing
        for path in paths:
            per_call(wire, path, 3)
    for _ in range(args.rounds):  # interleaved, so machine noise hits every wire alike
        for path in paths:
            for wire in BODIES:
                times[(wire, path)].append(per_call(wire, path, args.calls))
    print(
        f"per-call time through the gateway, {args.calls} calls x {args.rounds} rounds (median), ratio to chat on the same path"
    )
    print(f"{'wire':<12}" + "".join(f"{p:>22}" for p in paths))
    for wire in BODIES:
        cells = []
        for path in paths:
            us, chat = statistics.median(times[(wire, path)]) * 1e6, statistics.median(times[("chat", path)]) * 1e6
            cells.append(f"{us:8.0f} us  x{us / chat:5.2f}")
        print(f"{wire:<12}" + "".join(f"{c:>22}" for c in cells))


if __name__ == "__main__":
    main()
