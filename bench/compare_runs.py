"""Two runs of the same command, compared call for call: is a change free of behaviour change?

    python bench/compare_runs.py RUN_A RUN_B [--logprob-tol 1e-3]

Reads each run folder's ``trajectories/step-*.jsonl`` and ``eval/step-*.jsonl`` (episodes matched
by step, task id and seed, as a run writes them in completion order) and ``metrics.jsonl``, and
prints, per file, how many episodes match on every call's prompt and completion token ids, how many
final rewards are equal, and the largest difference of a recorded log-probability between the two
(batching and the prefix cache change log-probs in their last bits, docs/training.md). Exits 1
when a token, a reward or a step's train reward differs, or a log-prob beyond ``--logprob-tol``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _episodes(path: Path) -> dict[tuple[str, int], dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {(row["task"]["id"], row["seed"]): row for row in rows}


def _compare_episode(a: dict, b: dict) -> tuple[bool, bool, float]:
    """(the token ids of every call equal, the final reward equal, the largest log-prob difference)."""
    steps_a, steps_b = a["steps"], b["steps"]
    tokens_equal = len(steps_a) == len(steps_b)
    worst = 0.0
    for step_a, step_b in zip(steps_a, steps_b):
        ca, cb = step_a.get("completion") or {}, step_b.get("completion") or {}
        for key in ("prompt_token_ids", "completion_token_ids"):
            tokens_equal &= ca.get(key) == cb.get(key)
        la, lb = ca.get("logprobs") or [], cb.get("logprobs") or []
        if len(la) == len(lb):
            worst = max([worst, *(abs(x - y) for x, y in zip(la, lb))])
    return tokens_equal, a.get("final_reward") == b.get("final_reward"), worst


def _train_rewards(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {int(r["step"]): r["train/reward/mean"] for r in rows if "train/reward/mean" in r}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    parser.add_argument("--logprob-tol", type=float, default=1e-3, help="largest log-prob difference accepted")
    args = parser.parse_args(argv)
    for run in (args.run_a, args.run_b):
        if not (run / "metrics.jsonl").is_file():
            parser.error(f"{run} is not a run folder (no metrics.jsonl): pass the --output-dir of a train run")
    same = True
    worst_all = 0.0
    for sub in ("trajectories", "eval"):
        for file_a in sorted((args.run_a / sub).glob("step-*.jsonl")):
            file_b = args.run_b / sub / file_a.name
            if not file_b.is_file():
                print(f"{sub}/{file_a.name}: missing in {args.run_b}")
                same = False
                continue
            eps_a, eps_b = _episodes(file_a), _episodes(file_b)
            keys = sorted(set(eps_a) & set(eps_b))
            results = [_compare_episode(eps_a[k], eps_b[k]) for k in keys]
            tokens = sum(r[0] for r in results)
            rewards = sum(r[1] for r in results)
            worst = max([0.0, *(r[2] for r in results)])
            worst_all = max(worst_all, worst)
            unmatched = len(set(eps_a) ^ set(eps_b))
            print(
                f"{sub}/{file_a.name}: {len(keys)} episodes matched ({unmatched} unmatched), tokens equal in {tokens}, "
                f"final reward equal in {rewards}, largest log-prob difference {worst:.2e}"
            )
            same &= unmatched == 0 and tokens == len(keys) and rewards == len(keys)
    rewards_a, rewards_b = _train_rewards(args.run_a), _train_rewards(args.run_b)
    print(f"train reward by step: {[rewards_a.get(s) for s in sorted(rewards_a)]} vs {[rewards_b.get(s) for s in sorted(rewards_b)]}")
    same &= rewards_a == rewards_b
    same &= worst_all <= args.logprob_tol
    print("SAME" if same else "DIFFERENT")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
