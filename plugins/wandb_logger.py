"""Weights & Biases logging of training runs, on the run-logging hooks.

Active for a run whose config has ``"wandb"`` in ``report_to`` (the default; the ``train``
command's ``--no-wandb`` removes it). It logs:

* the run's config, at start;
* every metric of every step (rewards — mean and per source —, success rate, turns, tokens/s,
  loss, KL, grad norm, clip ratios, entropy, merge/fallback and infra-failure counts, rollout /
  update / sync seconds) and of every held-out evaluation (``eval/...``);
* a ``wandb.Table`` of sample episodes per logged step: each call's prompt (its last messages),
  completion and rewards, with the episode's status and final reward.

With no ``WANDB_API_KEY`` (and ``WANDB_MODE`` unset) the run is written offline under
``<output_dir>/wandb`` and the folder is printed with the command that uploads it. A resumed run
continues the same W&B run. If ``wandb`` is not installed the run goes on and says so: the same
metrics are always in ``<output_dir>/metrics.jsonl`` (the ``metrics_jsonl`` plugin).
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentgym_lightning.hookspecs import hookimpl
from agentgym_lightning.trajectory import Trajectory

#: Characters of a prompt or completion kept in the episodes table.
MAX_TEXT = 2000
_RUN_ID_FILE = "wandb_run_id"


class _State:
    run: Any = None
    mode: str = "online"
    folder: Path | None = None


_state = _State()


def _mode() -> str:
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


@hookimpl
def agentgym_train_start(config: Mapping[str, Any], output_dir: str, step: int) -> Sequence[str] | None:
    if "wandb" not in (config.get("report_to") or []):
        return None
    try:
        import wandb
    except ImportError:
        return ["W&B: wandb is not installed (pip install 'agentgym-lightning[train]'); metrics go to metrics.jsonl only"]
    # W&B's own banners (and its LLM-tracing advertisement) would drown the progress bar; the
    # run folder is reported below.
    os.environ.setdefault("WANDB_SILENT", "true")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    id_file = out / _RUN_ID_FILE
    run_id = id_file.read_text().strip() if id_file.is_file() and step > 0 else uuid.uuid4().hex[:8]
    _state.mode = _mode()
    _state.run = wandb.init(
        project=os.environ.get("WANDB_PROJECT", "agentgym-lightning"),
        name=config.get("run_name") or None,
        config=dict(config),
        dir=str(out),
        mode=_state.mode,
        id=run_id,
        resume="allow",
        settings=wandb.Settings(console="off", quiet=True),
    )
    id_file.write_text(run_id)
    _state.folder = Path(_state.run.dir).parent
    return [f"W&B run ({_state.mode}): {_state.folder}"]


@hookimpl
def agentgym_log_metrics(metrics: Mapping[str, float], step: int | None) -> None:
    if _state.run is None:
        return
    values = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}
    _state.run.log(values, step=step)


@hookimpl
def agentgym_log_episodes(trajectories: Sequence[Trajectory], step: int) -> None:
    if _state.run is None or not trajectories:
        return
    import wandb

    table = wandb.Table(columns=episode_table_columns())
    for row in episode_table_rows(trajectories, step):
        table.add_data(*row)
    _state.run.log({"episodes": table}, step=step)


@hookimpl
def agentgym_train_end(output_dir: str, metrics: Mapping[str, float], interrupted: bool) -> Sequence[str] | None:
    if _state.run is None:
        return None
    run, folder, mode = _state.run, _state.folder, _state.mode
    _state.run = None
    run.finish(exit_code=1 if interrupted else 0)
    if mode == "offline":
        return [f"W&B run (offline): {folder}  — upload it with `wandb sync {folder}`"]
    return [f"W&B run: {getattr(run, 'url', None) or folder}"]


def episode_table_columns() -> list[str]:
    return ["step", "episode", "group", "status", "final_reward", "call", "role", "trainable", "prompt", "completion", "rewards"]


def episode_table_rows(trajectories: Sequence[Trajectory], step: int) -> list[list[Any]]:
    """One row per LLM call of each episode (what the W&B table shows)."""
    rows = []
    for t in trajectories:
        for s in t.steps:
            prompt = "\n".join(f"[{m.get('role')}] {_text(m.get('content'))}" for m in s.request.messages[-4:])
            completion = s.completion.text if s.completion is not None else ""
            if s.completion is not None and s.completion.tool_calls:
                completion += "".join(f"\n<tool_call {c.name}> {c.arguments}" for c in s.completion.tool_calls)
            rewards = ", ".join(f"{r.source}={r.value:+.3f}" for r in s.rewards)
            rows.append(
                [step, t.episode_id[:12], t.group_id, t.status.value, t.final_reward, s.index, s.role or "", s.trainable,
                 prompt[-MAX_TEXT:], completion[:MAX_TEXT], rewards]
            )
    return rows


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) if isinstance(p, Mapping) else str(p) for p in content)
    return "" if content is None else str(content)
