"""Open file descriptors of the process over many episodes whose agents build their own client on
the episode's base URL and never close it, over HTTP.

Each episode's agent makes one call through a client of its own and returns without closing it,
as most agents written for a framework do:

- ``langchain``: ``ChatOpenAI(base_url=ctx.base_url)`` (``langchain-openai`` caches the httpx
  client of each base URL, 128 of them);
- ``openai``: ``openai.OpenAI(base_url=ctx.base_url)`` (released when the garbage collector
  gets to it).

The agent runs in this process, so each connection is two sockets here: the client's and the
gateway's. Every ``--every`` episodes the table shows the process's open descriptors and its TCP
sockets to and from the gateway by side and state; a run of N episodes takes about N / 5 s on a
shared 2-core machine, under the gateway's 30 s keep-alive timeout only for the last ~150.

    python bench/bench_episode_sockets.py [--agent langchain|openai] [--episodes 1000] [--every 100]
"""

from __future__ import annotations

import argparse
import collections
import os
import time
from typing import Any

import psutil

from agentgym_lightning.env import AgentEnv
from agentgym_lightning.gateway import Gateway


def langchain_agent(task: str, ctx: Any) -> str:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=ctx.base_url, api_key=ctx.api_key, model=ctx.model, max_retries=0)
    return str(llm.invoke(task).content)


def openai_agent(task: str, ctx: Any) -> str:
    import openai

    client = openai.OpenAI(base_url=ctx.base_url, api_key=ctx.api_key, max_retries=0)
    r = client.chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": task}])
    return r.choices[0].message.content or ""


AGENTS = {"langchain": langchain_agent, "openai": openai_agent}


def sockets(port: int) -> collections.Counter[str]:
    """The process's TCP sockets to (client side) and from (gateway side) the gateway, by state."""
    counts: collections.Counter[str] = collections.Counter()
    for c in psutil.Process().net_connections(kind="tcp"):
        if c.raddr and c.laddr.port == port:
            counts[f"gateway {c.status}"] += 1
        elif c.raddr and c.raddr.port == port:
            counts[f"client {c.status}"] += 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agent", choices=sorted(AGENTS), default="langchain")
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--every", type=int, default=100)
    args = parser.parse_args()

    gateway = Gateway()
    env = AgentEnv(AGENTS[args.agent], ["hi"], lambda task, result: 0.0, gateway=gateway, transport="http")
    fds0 = len(os.listdir("/proc/self/fd"))
    start = time.monotonic()
    print(f"agent {args.agent}; open descriptors before the first episode: {fds0}")
    print(f"{'episodes':>8} {'seconds':>8} {'fds':>6}  sockets to/from the gateway")
    try:
        for i in range(1, args.episodes + 1):
            env.reset(seed=i)
            *_, terminated, _, info = env.step("ok")
            if not terminated or info["status"] != "succeeded":
                raise RuntimeError(f"episode {i} ended {info.get('status')}: {info.get('error')}")
            if i % args.every == 0 or i == args.episodes:
                time.sleep(0.2)  # let a close made at the episode's end be seen
                counts = sockets(gateway.port)
                shown = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"
                print(f"{i:>8} {time.monotonic() - start:>8.0f} {len(os.listdir('/proc/self/fd')):>6}  {shown}", flush=True)
    finally:
        env.close()
        gateway.close()


if __name__ == "__main__":
    main()
