"""Write a synthetic training-run folder, shaped as ``agentgym-lightning train`` writes one, for the
viewer's benchmark and tests (no model: scripted episodes with random rewards).

    python bench/synthetic_run.py /tmp/run50 --steps 50 --tasks 5 --group-size 4   # 1,000 episodes

Each episode continues one conversation over ``calls`` LLM calls (a calculator tool call, its
result, a final answer), with token ids and logprobs, AIR rewards and a final reward; the
metrics are the names the trainer logs (docs/metrics.md).
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path

from agentgym_lightning import ChatRequest, Completion, Reward, Status, Step, ToolCall, Trajectory, TrajectoryWriter

TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "evaluate an arithmetic expression",
                                            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}]


def episode(rng: random.Random, step: int, task: int, member: int, calls: int, skill: float) -> Trajectory:
    a, b = 10 + task * 7 + step, 3 + task
    messages = [{"role": "system", "content": "You solve arithmetic with the calculator tool. " * 8},
                {"role": "user", "content": f"What is {a} * {b}?"}]
    prompt_ids = [rng.randrange(50_000) for _ in range(180)]
    steps = []
    correct = rng.random() < skill
    for i in range(calls):
        last = i == calls - 1
        n = rng.randrange(8, 30)
        ids = [rng.randrange(50_000) for _ in range(n)]
        logprobs = [-abs(rng.gauss(0, 0.8)) for _ in range(n)]
        if last:
            completion = Completion(text=f"The answer is {a * b if correct else a * b + rng.randrange(1, 9)}.", prompt_token_ids=list(prompt_ids),
                                    completion_token_ids=ids, logprobs=logprobs)
        else:
            completion = Completion(text="", tool_calls=[ToolCall(f"call_{i}", "calculator", json.dumps({"expression": f"{a}*{b}"}))],
                                    prompt_token_ids=list(prompt_ids), completion_token_ids=ids, logprobs=logprobs)
        request = ChatRequest.from_openai({"model": "smollm2-135m", "messages": [dict(m) for m in messages], "tools": TOOLS, "temperature": 1.0})
        rewards = [Reward(0.5, "math.calc_ok", raw=1.0)] if not last and rng.random() < skill else []
        steps.append(Step(index=i, request=request, completion=completion, rewards=rewards, outcome={"tool_ok": bool(rewards)},
                          prompt_extends_previous=None if i == 0 else True))
        messages += [{"role": "assistant", "content": completion.text, "tool_calls": [tc.to_openai() for tc in completion.tool_calls]},
                     {"role": "tool", "tool_call_id": f"call_{i}", "content": str(a * b)}]
        prompt_ids += ids + [rng.randrange(50_000) for _ in range(12)]
    status = Status.INFRA_FAILED if rng.random() < 0.005 else Status.SUCCEEDED
    return Trajectory(episode_id=f"s{step}-t{task}-m{member}", task={"question": f"{a} * {b}", "answer": a * b}, env_id="lightning/Arithmetic-v0",
                      steps=steps, final_reward=None if status is Status.INFRA_FAILED else float(correct), status=status,
                      group_id=f"s{step}-t{task}", seed=step * 1000 + task * 10 + member, result=steps[-1].completion.text)


def write_run(path: str | Path, *, steps: int = 50, tasks: int = 5, group_size: int = 4, calls: int = 3,
              eval_every: int = 10, eval_episodes: int = 8, seed: int = 0) -> Path:
    """Write the run folder; returns its path."""
    out = Path(path)
    rng = random.Random(seed)
    records = []
    for step in range(0, steps + 1):
        skill = 0.2 + 0.6 * step / max(steps, 1)
        if step % eval_every == 0 or step == steps:
            with TrajectoryWriter(out / "eval" / f"step-{step:06d}.jsonl") as w:
                evals = [episode(rng, step, 100 + k, 0, calls, skill * 0.9) for k in range(eval_episodes)]
                for t in evals:
                    w.write(t)
            records.append({"step": step, "eval/episodes": float(eval_episodes), "eval/reward/mean": sum(t.final_reward or 0 for t in evals) / eval_episodes,
                            "eval/success_rate": sum(1 for t in evals if t.final_reward) / eval_episodes, "eval/turns/mean": float(calls)})
        if step == 0:
            continue
        trajectories = [episode(rng, step, task, m, calls, skill) for task in range(tasks) for m in range(group_size)]
        with TrajectoryWriter(out / "trajectories" / f"step-{step:06d}.jsonl") as w:
            for t in trajectories:
                w.write(t)
        n = len(trajectories)
        reward = sum(t.final_reward or 0 for t in trajectories) / n
        air = sum(r.value for t in trajectories for s in t.steps for r in s.rewards) / n
        records.append({
            "step": step, "train/episodes": float(n), "train/reward/mean": reward, "train/reward/total": reward + air,
            "train/reward/math.calc_ok": air, "train/reward/final": reward, "train/success_rate": reward, "train/turns/mean": float(calls),
            "train/tokens_per_s": 40 + rng.random() * 5, "train/status/infra_failed": float(sum(t.status is Status.INFRA_FAILED for t in trajectories)),
            "samples/groups": float(tasks), "samples/groups/zero_variance": float(rng.randrange(0, 3)),
            "loss": rng.gauss(0, 0.05), "kl": 0.001 * step, "entropy": 1.2 * math.exp(-step / 80), "grad_norm": 2 + rng.random(),
            "clip_ratio/low": 0.0, "clip_ratio/high": 0.001 * rng.random(), "clip_ratio/region": 0.001 * rng.random(),
            "time/rollout_s": 20 + rng.random() * 4, "time/update_s": 30 + rng.random() * 6, "time/sync_s": 0.0, "time/step_s": 55.0,
        })
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").write_text("".join(json.dumps({"time": 0.0, **r}) + "\n" for r in records), encoding="utf-8")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--tasks", type=int, default=5)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = write_run(args.path, steps=args.steps, tasks=args.tasks, group_size=args.group_size, calls=args.calls, seed=args.seed)
    print(f"{out}: {args.steps * args.tasks * args.group_size} training episodes")


if __name__ == "__main__":
    main()
