"""The benches' env flags (bench/env_args.py), the config bench_update replays a run with, and the engines bench_rollout_engine compares."""

from __future__ import annotations

import argparse
import json
import runpy
from pathlib import Path
from types import SimpleNamespace

from agentgym_lightning.training import LightningRLConfig

REPO = Path(__file__).resolve().parents[1]
env_args = SimpleNamespace(**runpy.run_path(str(REPO / "bench" / "env_args.py")))
bench_update = SimpleNamespace(**runpy.run_path(str(REPO / "bench" / "bench_update.py")))


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    env_args.add_env_arguments(parser)
    return parser.parse_args(argv)


def test_the_main_jobs_env_by_default_and_kwargs_override_it() -> None:
    assert env_args.env_of(parse()) == ("lightning/Arithmetic-v0", {"difficulty": 3, "examples": 1})
    assert env_args.env_of(parse("--env-kwarg", "difficulty=4")) == ("lightning/Arithmetic-v0", {"difficulty": 4, "examples": 1})


def test_a_named_env_takes_only_the_kwargs_given_as_json_values() -> None:
    args = parse("--env", "bench/spider_counts.py:make_env", "--env-kwarg", "split=train", "--env-kwarg", "limit=4",
                 "--env-kwarg", "train_checker=true")
    assert env_args.env_of(args) == ("bench/spider_counts.py:make_env", {"split": "train", "limit": 4, "train_checker": True})


def test_env_flags_read_back_as_the_same_env() -> None:
    kwargs = {"split": "train", "limit": 4, "agent": "langgraph", "sql_limits": {"max_rows": 10}}
    assert env_args.env_of(parse(*env_args.env_flags("lightning/Spider-v0", kwargs))) == ("lightning/Spider-v0", kwargs)


def replay_args(*argv: str) -> argparse.Namespace:
    args = SimpleNamespace(micro_batch_tokens=None, gradient_checkpointing=None, padded_defaults=False)
    return argparse.Namespace(**{**vars(parse(*argv)), **vars(args)})


def save_run(tmp_path: Path, **options: object) -> Path:
    """A run folder whose one checkpoint saved ``options`` as its config, as the trainer does."""
    checkpoint = tmp_path / "run" / "checkpoints" / "checkpoint-000001"
    checkpoint.mkdir(parents=True)
    config = LightningRLConfig(**options).to_dict()  # type: ignore[arg-type]
    (checkpoint / "trainer_state.json").write_text(json.dumps({"step": 1, "config": config}), encoding="utf-8")
    return checkpoint.parent.parent


def test_bench_update_replays_a_run_with_its_own_config(tmp_path: Path) -> None:
    run = save_run(tmp_path, env="lightning/Spider-v0", env_kwargs={"agent": "langgraph", "split": "train"},
                   agent_match="writer|rewriter", loss_type="grpo", micro_batch_tokens=1024, gradient_checkpointing=True,
                   backend="vllm", policy_kwargs={"gpu_memory_utilization": 0.5})
    tree = bench_update.replay_config(run, replay_args(), "tree")
    assert (tree["backend"], tree["policy_kwargs"]) == ("hf", {})  # the update's model, no generator of its own
    assert (tree["env"], tree["env_kwargs"], tree["agent_match"], tree["loss_type"]) == (
        "lightning/Spider-v0", {"agent": "langgraph", "split": "train"}, "writer|rewriter", "grpo")
    assert (tree["micro_batch_tokens"], tree["gradient_checkpointing"], tree["packed_update"]) == (1024, True, True)
    assert tree["output_dir"] != str(run)  # never the run's own folder
    padded = bench_update.replay_config(run, replay_args(), "padded")
    assert (padded["micro_batch_tokens"], padded["gradient_checkpointing"], padded["packed_update"]) == (1024, True, False)


def test_bench_update_flags_override_the_runs_options(tmp_path: Path) -> None:
    run = save_run(tmp_path, env="lightning/Spider-v0", micro_batch_tokens=1024, gradient_checkpointing=True)
    args = replay_args("--env", "lightning/Spider-v0", "--env-kwarg", "agent=langgraph")
    args.micro_batch_tokens, args.gradient_checkpointing, args.padded_defaults = 512, False, True
    tree = bench_update.replay_config(run, args, "tree")
    assert (tree["env_kwargs"], tree["micro_batch_tokens"], tree["gradient_checkpointing"]) == ({"agent": "langgraph"}, 512, False)
    padded = LightningRLConfig.from_dict(bench_update.replay_config(run, args, "padded"))
    defaults = LightningRLConfig()
    assert (padded.micro_batch_tokens, padded.gradient_checkpointing) == (defaults.micro_batch_tokens, defaults.gradient_checkpointing)


def test_bench_update_replays_a_run_without_checkpoint_on_the_env_flags(tmp_path: Path) -> None:
    config = bench_update.replay_config(tmp_path, replay_args(), "tree")
    assert (config["env"], config["env_kwargs"]) == ("lightning/Arithmetic-v0", {"difficulty": 3, "examples": 1})
    LightningRLConfig.from_dict(config)  # a valid config


def test_bench_rollout_engine_modes() -> None:
    """The engines bench_rollout_engine compares by default: hf per-step and vLLM on CPU where it
    imports, hf per-step and the compiled decode step on a GPU (hf's batch mode is gone)."""
    import importlib.util

    engine = SimpleNamespace(**runpy.run_path(str(REPO / "bench" / "bench_rollout_engine.py")))
    cpu = ["hf-per-step"] + (["vllm"] if importlib.util.find_spec("vllm") else [])
    assert engine._default_modes("cpu") == cpu
    assert engine._default_modes("cuda") == ["hf-per-step", "hf-compiled"]
    assert set(engine._default_modes("cuda:1")) <= set(engine.MODES)
