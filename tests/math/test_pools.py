"""bench/pools/: the measured pools kept in the repository are task files of keys that the real GSM8K holds."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
POOLS = REPO / "bench" / "pools"
NAME = re.compile(r"^math-s(?P<seed>\d+)-p(?P<problems>\d+)x(?P<samples>\d+)-c(?P<slice>\d+)\.jsonl$")


def _pools() -> dict[Path, re.Match]:
    files = sorted(POOLS.glob("*.jsonl"))
    assert files, "bench/pools holds no pool"
    named = {f: NAME.match(f.name) for f in files}
    assert all(named.values()), [f.name for f, m in named.items() if not m]
    return named


def test_each_kept_slice_is_keys_and_counts_as_its_name_says_and_the_readme_lists_it():
    readme = (POOLS / "README.md").read_text(encoding="utf-8")
    keys_by_seed: dict[str, list[str]] = defaultdict(list)
    for path, name in _pools().items():
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        assert len(rows) == int(name["problems"]), path.name
        for row in rows:
            # No task text: a kept pool copies nothing of the dataset.
            assert set(row) == {"key", "attempts", "successes", "pass_rate"}, (path.name, row)
            assert re.fullmatch(r"id:gsm8k-train-\d+", row["key"]), (path.name, row)
            assert row["attempts"] == int(name["samples"]) and 0 <= row["successes"] <= row["attempts"], (path.name, row)
            assert row["pass_rate"] == row["successes"] / row["attempts"]
        keys_by_seed[name["seed"]] += [r["key"] for r in rows]
        assert f"`{path.name}`" in readme, f"bench/pools/README.md does not list {path.name}"
    for seed, keys in keys_by_seed.items():  # a seed's slices are disjoint parts of one shuffled order
        assert len(keys) == len(set(keys)), f"seed {seed}'s slices share a problem"


def test_every_kept_key_names_a_gsm8k_train_problem_and_the_task_file_reader_finds_it(gsm8k_dir):
    from agentgym_lightning.envs.math.data import load_gsm8k
    from agentgym_lightning.training.pass_rates import load_task_file

    tasks = load_gsm8k("train", gsm8k_dir).tasks()
    for path in _pools():
        found = load_task_file(path, tasks=tasks)
        assert len(found) == len(path.read_text(encoding="utf-8").splitlines())
        assert all(t["split"] == "train" for t in found)
