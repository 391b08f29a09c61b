"""Zero-shot reward of each framework agent next to the from-scratch agent, on the same tasks.

For each bundled env with a framework agent, both agents run greedy on the same held-out tasks
(the first ``--episodes`` tasks of the split, in order), answered by one policy (default: the
embedded SmolLM2-135M on CPU, ``hf`` backend; greedy at the policy, whatever an agent asks for):

- ``lightning/Arithmetic-v0``: the from-scratch solver (text and tools protocols) vs the AutoGen
  ``AssistantAgent`` (tools);
- ``lightning/Spider-v0``: the from-scratch write -> check -> rewrite agent vs the LangGraph graph;
- ``lightning/MuSiQue-v0``: the from-scratch searcher (tools) vs the OpenAI Agents SDK ``Agent``.

Agents that call tools natively (AutoGen, the Agents SDK, the ``tools`` protocols) depend on how
the policy describes tools to a model whose chat template has none: each row names the policy's
``tool_prompt`` (``full``: Qwen2.5's wording; ``compact``: one sentence per tool).

The table shows each agent's mean reward, success rate, calls per episode and the env's own
metrics, and whether the two agents of a pair saw the same task ids. ``--out`` writes it as JSON::

    python bench/framework_rewards.py --episodes 16 --max-tokens 160 --spider-dir ../shared/data/spider \\
        --musique-dir ../shared/data/musique --out /tmp/framework_rewards.json

An env whose data is not found uses its bundled sample and says so (numbers for smoke only).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import agentgym_lightning  # noqa: F401 - registers the lightning/... ids
from agentgym_lightning.rollouts.evaluation import evaluate
from agentgym_lightning.policies import make_policy
from agentgym_lightning.training.generation import SamplingOverride


def pairs(args: argparse.Namespace) -> list[tuple[str, str, str, dict[str, Any]]]:
    """``(env id, label, tool prompt, env kwargs)`` in the order they run; a pair shares everything
    but the agent. The tool prompt is the policy's (``full`` or ``compact``, see
    :data:`~agentgym_lightning.policies.tool_calls.TOOL_PROMPTS`): how tools are described to a
    model whose chat template has none (SmolLM2)."""
    greedy = {"time_limit": None}
    math = {**greedy, "split": "test", "difficulty": args.math_difficulty, "examples": args.math_examples}
    spider = {**greedy, "split": "dev", "max_tokens": args.max_tokens, **({"data_dir": args.spider_dir} if args.spider_dir else {})}
    rag = {**greedy, "max_turns": args.rag_turns, "tool_mode": "tools", "examples": args.rag_examples,
           **({"data_dir": args.musique_dir} if args.musique_dir else {})}
    found = [
        ("lightning/Arithmetic-v0", "scratch (text)", "full", {**math, "protocol": "text"}),
        ("lightning/Arithmetic-v0", "scratch (tools)", "full", {**math, "protocol": "tools"}),
        ("lightning/Arithmetic-v0", "autogen", "full", {**math, "agent": "autogen"}),
        ("lightning/Arithmetic-v0", "scratch (tools)", "compact", {**math, "protocol": "tools"}),
        ("lightning/Arithmetic-v0", "autogen", "compact", {**math, "agent": "autogen"}),
        ("lightning/Spider-v0", "scratch", "full", spider),
        ("lightning/Spider-v0", "langgraph", "full", {**spider, "agent": "langgraph"}),
        ("lightning/MuSiQue-v0", "scratch (tools)", "compact", rag),
        ("lightning/MuSiQue-v0", "openai-agents", "compact", {**rag, "agent": "openai-agents"}),
    ]
    return [p for p in found if not args.only or any(o in f"{p[0]} {p[1]} {p[2]}" for o in args.only)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=16, help="tasks per agent (one greedy episode each)")
    p.add_argument("--seed", type=int, default=7_919, help="seeds the episodes' resets (7919: as the trainer's evaluation for seed 0)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--backend", default="hf")
    p.add_argument("--max-batch-size", type=int, default=16)
    p.add_argument("--math-difficulty", type=int, default=4)
    p.add_argument("--math-examples", type=int, default=3)
    p.add_argument("--spider-dir", default=None)
    p.add_argument("--musique-dir", default=None)
    p.add_argument("--rag-examples", type=int, default=0, help="worked examples before each MuSiQue question (0 to 2)")
    p.add_argument("--rag-turns", type=int, default=3, help="most calls of a MuSiQue episode")
    p.add_argument("--max-tokens", type=int, default=160, help="max_tokens of each Spider call (its agent asks for 384; MuSiQue keeps its 96)")
    p.add_argument("--only", nargs="*", default=[], help="run only the rows whose 'env agent tool-prompt' contains one of these")
    p.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    p.add_argument("--trajectories", type=Path, default=None, help="folder for each agent's trajectories (JSONL)")
    args = p.parse_args()

    policy = make_policy(args.backend, args.model, max_batch_size=args.max_batch_size)
    # Greedy whatever each agent asks for (as the trainer's evaluation): the comparison is of agents,
    # not of their sampling settings.
    greedy_policy = SamplingOverride(policy, temperature=0.0)
    rows: list[dict[str, Any]] = []
    try:
        for env_id, label, tool_prompt, kwargs in pairs(args):
            policy.tool_prompt = tool_prompt  # one loaded model for every row
            label = f"{label} [{tool_prompt}]"
            output = None
            if args.trajectories:
                args.trajectories.mkdir(parents=True, exist_ok=True)
                output = str(args.trajectories / f"{len(rows)}-{env_id.split('/')[-1]}-{label.split()[0]}-{tool_prompt}.jsonl")
            start = time.perf_counter()
            result = evaluate(env_id, greedy_policy, episodes=args.episodes, concurrency=args.episodes, seed=args.seed,
                              env_kwargs=kwargs, output=output, progress=False, log_metrics=False)
            m = result.metrics
            row = {
                "env": env_id, "agent": label, "episodes": int(m["episodes"]), "reward": m["reward/mean"],
                "success_rate": m["success_rate"], "calls_per_episode": m["turns/mean"],
                "statuses": {k.split("/", 1)[1]: int(v) for k, v in m.items() if k.startswith("status/")},
                "metrics": {k.split("/", 1)[1]: v for k, v in m.items() if k.startswith("metrics/")},
                "task_ids": sorted(str(t.task.get("id")) for t in result.trajectories if isinstance(t.task, dict)),
                "wall_s": time.perf_counter() - start,
            }
            rows.append(row)
            print(f"{env_id:<24} {label:<26} reward {row['reward']:.3f}  success {row['success_rate']:.3f}  "
                  f"calls {row['calls_per_episode']:.2f}  {row['statuses']}  {row['wall_s']:.0f} s", flush=True)
    finally:
        policy.close()

    print(f"\n{'env':<24} {'agent [tool prompt]':<26} {'reward':>7} {'success':>8} {'calls':>6}  same tasks  metrics")
    first_of: dict[str, list[str]] = {}
    for row in rows:
        same = first_of.setdefault(row["env"], row["task_ids"]) == row["task_ids"]
        metrics = ", ".join(f"{k} {v:.3f}" for k, v in sorted(row["metrics"].items()))
        print(f"{row['env']:<24} {row['agent']:<26} {row['reward']:>7.3f} {row['success_rate']:>8.3f} "
              f"{row['calls_per_episode']:>6.2f}  {'yes' if same else 'NO':<10}  {metrics}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1), encoding="utf-8")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
