"""A run's held-out evaluation: the same episodes every time, written, checked and logged.

The RL trainer's and the SFT trainer's (before training, every ``eval_steps``, at the end): the
held-out env's ``episodes`` tasks, one episode each, at ``temperature`` (greedy by default),
seeded from the run's seed so every evaluation runs the same tasks; the episodes go to
``<output_dir>/eval/step-<step>.jsonl`` and the metrics (``eval/...``, with ``eval/cpu_s``: the
CPU-seconds of this process's threads) to the ``agentgym_log_metrics`` hook at ``step``.

With ``eval_samples`` k > 0 each evaluation also samples k episodes of each of those tasks at the
training ``temperature`` (``eval/samples-step-<step>.jsonl``) and logs ``eval/pass@1``,
``eval/pass@<k>`` and ``eval/samples/groups_with_variance``
(:func:`agentgym_lightning.metrics.pass_at_k`): the ceiling RL can pull greedy accuracy toward, and
how many of the tasks a step at that temperature could learn from.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentgym_lightning.env import AgentEnv
from agentgym_lightning.failed_episodes import check_episodes_ran
from agentgym_lightning.memory import release_freed_memory
from agentgym_lightning.metrics import pass_at_k
from agentgym_lightning.rollouts.evaluation import evaluate
from agentgym_lightning.training.generation import SamplingOverride

__all__ = ["held_out_eval", "held_out_written", "HELD_OUT_SEED_OFFSET"]

#: Added to the run's seed for the held-out episodes (the same at every evaluation).
HELD_OUT_SEED_OFFSET = 7_919


def held_out_written(output_dir: Path, step: int, episodes: int) -> bool:
    """Whether the evaluation at ``step`` wrote all its ``episodes`` (``eval/step-<step>.jsonl``):
    a run killed during it, after its step's checkpoint, did not, and a resumed run runs it again."""
    written = output_dir / "eval" / f"step-{step:06d}.jsonl"
    return written.is_file() and len(written.read_text(encoding="utf-8").splitlines()) >= episodes


def _run(env_factory: Callable[[], AgentEnv], policy: Any, config: Any, *, group_size: int, written: Path, what: str) -> Any:
    """The held-out tasks, ``group_size`` episodes each, answered by ``policy`` and written to
    ``written``; raises when every episode failed before its first call."""
    episodes = config.eval_episodes * group_size
    result = evaluate(
        env_factory,
        policy,
        episodes=episodes,
        group_size=group_size,  # groups keep the tasks of the greedy evaluation, in its order
        concurrency=episodes,
        seed=config.seed + HELD_OUT_SEED_OFFSET,  # the same held-out tasks at every evaluation (a task function's too)
        output=written,
        progress=False,
        log_metrics=False,  # logged by the caller, with the step, once the episodes are known to have run
        strict=True,  # Ctrl-C and a failed write stop the run (the trainer checkpoints)
    )
    release_freed_memory()
    check_episodes_ran(result.trajectories, what, written)
    return result


def _sampled(env_factory: Callable[[], AgentEnv], generator: Any, config: Any, *, output_dir: Path, step: int) -> dict[str, float]:
    """The held-out tasks ``eval_samples`` times each at the training temperature: pass@1, pass@k."""
    policy = SamplingOverride(generator, temperature=config.temperature, top_p=getattr(config, "top_p", 1.0), max_tokens=config.max_completion_length)
    written = output_dir / "eval" / f"samples-step-{step:06d}.jsonl"
    result = _run(env_factory, policy, config, group_size=config.eval_samples, written=written, what=f"the sampled evaluation at step {step}")
    rates = pass_at_k(result.trajectories)
    return {
        **{f"eval/{name}": value for name, value in rates.items() if name.startswith("pass@")},
        "eval/samples/groups_with_variance": rates.get("groups_with_variance", float("nan")),
        "eval/samples/reward/mean": result.metrics["reward/mean"],
        "eval/samples/temperature": float(config.temperature),
    }


def held_out_eval(
    env_factory: Callable[[], AgentEnv] | None, generator: Any, config: Any, *, output_dir: Path, step: int, hook: Any
) -> dict[str, float]:
    """Run the held-out eval with ``generator`` (see the module docstring) as ``config`` says
    (``eval_episodes``, ``eval_temperature``, ``max_completion_length``, ``seed``: the RL and the SFT
    configs' fields); returns its metrics. ``RuntimeError`` when the run has no held-out env."""
    if env_factory is None:
        raise RuntimeError("no eval env: set config.eval_env_kwargs or pass eval_env=")
    policy = SamplingOverride(generator, temperature=config.eval_temperature, max_tokens=config.max_completion_length)
    written = output_dir / "eval" / f"step-{step:06d}.jsonl"
    cpu_start = time.process_time()
    result = _run(env_factory, policy, config, group_size=1, written=written, what=f"the evaluation at step {step}")
    metrics = {f"eval/{k}": v for k, v in result.metrics.items()}
    if getattr(config, "eval_samples", 0):
        metrics.update(_sampled(env_factory, generator, config, output_dir=output_dir, step=step))
    metrics["eval/cpu_s"] = time.process_time() - cpu_start  # this process's threads; tool subprocesses not counted
    hook.agentgym_log_metrics(metrics=metrics, step=step)
    return metrics
