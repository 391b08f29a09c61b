"""How well an LLM judge ranks a group's episodes as the env's verifier does.

Re-judges a run's recorded episodes (their verifier rewards are the ground truth) with any
OpenAI-compatible judge, or with a local model served for the occasion, and prints the
within-group rank agreement (``agentgym_lightning.judge.agreement``) and what judging cost::

    python bench/bench_judge_agreement.py runs/main --judge-model smollm2-135m          # the bundled model judges
    python bench/bench_judge_agreement.py runs/main --judge-base-url http://127.0.0.1:8000/v1 --judge-model Qwen2.5-7B-Instruct

Only groups whose verifier rewards differ are informative (the others have no order to agree
with); ``--max-groups`` takes the first such groups in step order.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from agentgym_lightning.judge import GroupJudge, JudgeConfig, agreement, approx_tokens  # noqa: E402
from agentgym_lightning.trajectory import load_trajectories  # noqa: E402


def informative_groups(paths: list[Path], max_groups: int) -> list[list]:
    groups: list[list] = []
    for path in paths:
        by_group: dict[str, list] = {}
        for t in load_trajectories(path, on_error="skip"):
            if t.trainable and t.final_reward is not None:
                by_group.setdefault(t.group_id or t.episode_id, []).append(t)
        for members in by_group.values():
            if len(members) > 1 and len({t.final_reward for t in members}) > 1:
                groups.append(members)
                if len(groups) == max_groups:
                    return groups
    return groups


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="a run folder (its trajectories/step-*.jsonl) or one trajectory JSONL")
    p.add_argument("--judge-base-url", help="the judge's OpenAI-compatible URL; absent: serve --judge-model locally with hf")
    p.add_argument("--judge-model", default="smollm2-135m")
    p.add_argument("--mode", default="relative", choices=["relative", "absolute"])
    p.add_argument("--transcript", action="store_true")
    p.add_argument("--max-groups", type=int, default=16)
    p.add_argument("--max-prompt-tokens", type=int, default=3000)
    p.add_argument("--max-tokens", type=int, default=96, help="the judge's answer limit (a scores object of 8 needs ~40 tokens)")
    p.add_argument("--timeout-s", type=float, default=600.0, help="seconds per judge call (a CPU judge prefills thousands of tokens)")
    args = p.parse_args()

    paths = sorted((args.run / "trajectories").glob("step-*.jsonl")) if args.run.is_dir() else [args.run]
    groups = informative_groups(paths, args.max_groups)
    if not groups:
        sys.exit(f"{args.run}: no group whose verifier rewards differ; nothing to compare")
    episodes = [t for g in groups for t in g]
    with contextlib.ExitStack() as stack:
        count_tokens = approx_tokens
        url = args.judge_base_url
        if url is None:
            from agentgym_lightning.policies import make_policy
            from agentgym_lightning.policies.policy_server import PolicyServer

            policy = make_policy("hf", args.judge_model, device="cpu", seed=0)
            server = stack.enter_context(PolicyServer(policy))
            url = server.base_url
            count_tokens = lambda text: len(policy.tokenizer(text).input_ids)  # noqa: E731
        config = JudgeConfig(
            base_url=url, model=args.judge_model, mode=args.mode, transcript=args.transcript, max_prompt_tokens=args.max_prompt_tokens, concurrency=2,
            max_tokens=args.max_tokens, timeout_s=args.timeout_s
        )
        judge = stack.enter_context(GroupJudge(config, count_tokens=count_tokens))
        t0 = time.perf_counter()
        stats = judge.judge(episodes)
        wall = time.perf_counter() - t0
    result = agreement(episodes)
    print(f"judge {args.judge_model} ({args.mode}{', transcript' if args.transcript else ''}) on {len(groups)} groups of {args.run}")
    print(f"  pairwise accuracy {result['pairwise_accuracy']:.3f} over {int(result['pairs'])} verifier-ordered pairs (0.5 = chance)")
    print(f"  Kendall tau-b     {result['kendall_tau']:.3f} (mean of {int(result['groups'])} groups)")
    print(
        f"  cost              {stats.calls} calls, {stats.prompt_tokens} prompt + {stats.completion_tokens} completion tokens, "
        f"{wall:.1f} s wall; {stats.bad_answers} bad answers, {stats.call_errors} errors, {stats.groups_failed} groups failed"
    )


if __name__ == "__main__":
    main()
