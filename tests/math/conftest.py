"""Fixtures for the math tests: the real GSM8K and Calc-X files in ../shared/data, and a cache
folder of the test's own (never the user's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
GSM8K_DIR = DATA / "gsm8k"
CALCX_DIR = DATA / "calcx"


@pytest.fixture(scope="session")
def gsm8k_dir() -> Path:
    if not (GSM8K_DIR / "test.jsonl").is_file():
        pytest.skip(f"needs the real GSM8K data at {GSM8K_DIR} (../shared/data/gsm8k from the repo root)")
    return GSM8K_DIR


@pytest.fixture(scope="session")
def calcx_file() -> Path:
    if not (CALCX_DIR / "sample.jsonl").is_file():
        pytest.skip(f"needs the Calc-X sample at {CALCX_DIR} (../shared/data/calcx from the repo root)")
    return CALCX_DIR / "sample.jsonl"


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own cache folder, no data environment variables, fresh loader state."""
    from agentgym_lightning.envs.math import data

    cache = tmp_path / "cache"
    monkeypatch.setenv("AGENTGYM_LIGHTNING_CACHE", str(cache))
    for spec in data.DATASETS.values():
        monkeypatch.delenv(spec.env_var, raising=False)
    monkeypatch.setattr(data, "_cache", {})
    monkeypatch.setattr(data, "_noticed", set())
    return cache


def play(env, policy, **reset_options: Any):
    """One episode; ``policy(obs, task) -> action``. Returns (trajectory, observations, return)."""
    obs, info = env.reset(seed=0, options=reset_options)
    task, observations, total, done = info["task"], [obs], 0.0, False
    while not done:
        obs, reward, terminated, truncated, info = env.step(policy(obs, task))
        observations.append(obs)
        total += reward
        done = terminated or truncated
    return info["trajectory"], observations[:-1], total
