"""``agentgym-lightning sft``: supervised fine-tuning on chosen episodes, rejection sampling, distillation.

::

    agentgym-lightning sft runs/main --top-k 2 --min-reward 1 --output-dir runs/sft   # SFT on a run's best episodes
    agentgym-lightning sft --rounds 2 --env lightning/Arithmetic-v0 --success-only      # rejection sampling
    agentgym-lightning sft --rounds 1 --teacher-base-url http://127.0.0.1:8000/v1 --success-only  # distillation
    agentgym-lightning sft --resume runs/sft                                           # continue a run
    agentgym-lightning train --init-from runs/sft                                      # then RL from it

SOURCEs are run folders (their ``trajectories/``; never ``eval/``) or trajectory JSONL files
(``eval --output``). Options come from, in order of precedence: the flags given, ``--config
FILE.yaml`` (any :class:`~agentgym_lightning.training.sft.SFTConfig` field), the resumed run's saved
config, the defaults. The run folder is ``train``'s (checkpoints, ``metrics.jsonl``, W&B, ``eval/``,
``final/``, ``report.html``) plus ``rows/`` (what each round trained on) and ``rollouts/`` (the
rounds' episodes). Exit status as ``train``'s: 0 done, 2 a bad option, 1 stopped on an error, 130/143
interrupted (after saving). docs/improve.md says when to use which.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

__all__ = ["register", "run", "build_config", "SFT_RUN_FILES"]

COMMAND = "sft"
HELP = "supervised fine-tuning on a run's best episodes (or a teacher's, or the student's own: --rounds)"

#: What an SFT run writes in its output folder (``--overwrite`` deletes these and nothing else).
SFT_RUN_FILES = ("metrics.jsonl", "checkpoints", "rows", "rollouts", "eval", "superseded", "final", "report.html", "wandb", "wandb_run_id")

# flag dest -> config field, for flags that map one to one
_DIRECT = {
    "env": "env", "model": "model", "backend": "backend", "output_dir": "output_dir", "min_reward": "min_reward", "top_k": "top_k",
    "agent_match": "agent_match", "retokenize": "retokenize", "steps": "max_steps", "rows_per_step": "rows_per_step",
    "learning_rate": "learning_rate", "seed": "seed", "save_steps": "save_steps", "eval_steps": "eval_steps",
    "eval_episodes": "eval_episodes", "rounds": "rounds", "tasks_per_round": "tasks_per_round", "group_size": "num_generations",
    "temperature": "temperature", "init_from": "init_from",
}


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``sft`` subcommand."""
    from agentgym_lightning.training.sft.config import RETOKENIZE, SFTConfig

    # The fields' own defaults (an SFTConfig of them has nothing to learn from, so none is built).
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory() for f in dataclasses.fields(SFTConfig)}  # type: ignore[misc]

    def h(name: str) -> str:
        text = SFTConfig.help_of(name).rstrip()
        return f"{text} (default: {defaults[name]})".replace("%", "%%")

    p = subparsers.add_parser(
        COMMAND, help=HELP, description=(__doc__ or "").split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Every option of the config: python -c 'from agentgym_lightning.training.sft import SFTConfig; help(SFTConfig)'",
    )
    p.add_argument("sources", nargs="*", metavar="SOURCE", help=h("sources"))
    p.add_argument("--config", metavar="FILE.yaml", help="YAML file of config options")
    p.add_argument("--resume", metavar="DIR", help="continue the run in DIR (its newest intact checkpoint) or from one checkpoint folder")
    p.add_argument("--overwrite", action="store_true",
                   help=f"start over in an --output-dir that holds a run: deletes its run files ({', '.join(SFT_RUN_FILES)}), nothing else")
    p.add_argument("--output-dir", help=h("output_dir"))
    choose = p.add_argument_group("which episodes")
    choose.add_argument("--min-reward", type=float, metavar="R", help=h("min_reward"))
    choose.add_argument("--top-k", type=int, metavar="K", help=h("top_k"))
    choose.add_argument("--success-only", action="store_const", const=True, default=None, help=h("success_only"))
    choose.add_argument("--agent-match", metavar="REGEX", help=h("agent_match"))
    choose.add_argument("--retokenize", choices=RETOKENIZE, help=h("retokenize"))
    steps = p.add_argument_group("the steps")
    steps.add_argument("--model", help=h("model"))
    steps.add_argument("--backend", choices=["hf", "vllm", "vllm-server"], help=h("backend"))
    steps.add_argument("--init-from", metavar="RUN", help=h("init_from"))
    steps.add_argument("--steps", type=int, metavar="N", help=h("max_steps"))
    steps.add_argument("--rows-per-step", type=int, metavar="N", help=h("rows_per_step"))
    steps.add_argument("--learning-rate", type=float, help=h("learning_rate"))
    steps.add_argument("--lora", action="store_const", const=True, default=None, help=h("use_peft"))
    steps.add_argument("--lora-per-agent", action="store_const", const=True, default=None, help=h("lora_per_agent"))
    steps.add_argument("--seed", type=int, help=h("seed"))
    steps.add_argument("--save-steps", type=int, help=h("save_steps"))
    rounds = p.add_argument_group("rounds: rejection sampling (the student) or distillation (a teacher)")
    rounds.add_argument("--rounds", type=int, metavar="N", help=h("rounds"))
    rounds.add_argument("--env", help=h("env"))
    rounds.add_argument("--env-kwarg", action="append", default=[], metavar="KEY=VALUE", help="the rounds' env keyword argument (repeatable; JSON values)")
    rounds.add_argument("--tasks-per-round", type=int, metavar="N", help=h("tasks_per_round"))
    rounds.add_argument("--group-size", type=int, metavar="G", help=h("num_generations"))
    rounds.add_argument("--temperature", type=float, help=h("temperature"))
    rounds.add_argument("--air", action="append", default=[], metavar="SOURCE=WEIGHT[,...]", help="AIR weights of the rounds' env (repeatable)")
    rounds.add_argument("--teacher-base-url", metavar="URL", help="roll the rounds out with this OpenAI-compatible teacher (distillation)")
    rounds.add_argument("--teacher-model", metavar="NAME", help="the teacher's model name (default: the server's first)")
    rounds.add_argument("--teacher-api-key", metavar="KEY", help="the teacher's API key (default: OPENAI_API_KEY, else none)")
    ev = p.add_argument_group("held-out evaluation")
    ev.add_argument("--eval-env-kwarg", action="append", default=[], metavar="KEY=VALUE", help="held-out env keyword argument (repeatable); turns the eval on")
    ev.add_argument("--eval-steps", type=int, help=h("eval_steps"))
    ev.add_argument("--eval-episodes", type=int, help=h("eval_episodes"))
    p.add_argument("--policy-kwarg", action="append", default=[], metavar="KEY=VALUE", help="policy backend keyword argument (repeatable)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="any config field (repeatable; JSON values), e.g. --set use_peft=true")
    p.add_argument("--no-wandb", action="store_true", help="do not log to Weights & Biases (metrics.jsonl is always written)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the final summary as one JSON object")
    p.set_defaults(func=run)


def build_config(args: argparse.Namespace) -> Any:
    """The run's :class:`SFTConfig` from the command line (see the module docstring)."""
    from agentgym_lightning.commands.eval import parse_kwargs
    from agentgym_lightning.commands.train import apply_run_options, parse_air
    from agentgym_lightning.training.checkpoint import find_checkpoint, saved_config
    from agentgym_lightning.training.sft.config import SFTConfig

    base: dict[str, Any] = {}
    if args.config:
        if not Path(args.config).is_file():
            raise ValueError(f"--config {args.config}: no such file")
        # The sources given on the command line complete the file (a recipe names none: they vary by run).
        base = SFTConfig.from_yaml(args.config, **({"sources": list(args.sources)} if args.sources else {})).to_dict()
    elif args.resume:
        base = saved_config(find_checkpoint(args.resume), SFTConfig.field_names())
    if args.sources:
        base["sources"] = list(args.sources)
    for dest, name in _DIRECT.items():
        if getattr(args, dest) is not None:
            base[name] = getattr(args, dest)
    for flag, name in (("success_only", "success_only"), ("lora", "use_peft"), ("lora_per_agent", "lora_per_agent")):
        if getattr(args, flag):
            base[name] = True
    if args.air:
        base["air_weights"] = {**base.get("air_weights", {}), **parse_air(args.air)}
    if args.env_kwarg:
        base["env_kwargs"] = {**base.get("env_kwargs", {}), **parse_kwargs(args.env_kwarg, "--env-kwarg")}
    if args.eval_env_kwarg:
        base["eval_env_kwargs"] = {**(base.get("eval_env_kwargs") or {}), **parse_kwargs(args.eval_env_kwarg, "--eval-env-kwarg")}
    if args.policy_kwarg:
        base["policy_kwargs"] = {**base.get("policy_kwargs", {}), **parse_kwargs(args.policy_kwarg, "--policy-kwarg")}
    teacher = {k: getattr(args, f"teacher_{k}") for k in ("base_url", "model", "api_key") if getattr(args, f"teacher_{k}") is not None}
    if teacher:
        base["teacher"] = {**(base.get("teacher") or {}), **teacher}
    apply_run_options(base, args)
    return SFTConfig.from_dict(base)


def run(args: argparse.Namespace) -> int:
    """The ``sft`` command (exit statuses: the module docstring)."""
    from agentgym_lightning.commands.train import prepare_run, run_trainer, write_run_report

    config = prepare_run(COMMAND, args, build_config, files=SFT_RUN_FILES, needs_envs=lambda c: bool(c.rounds or c.eval_env_kwargs is not None))
    if isinstance(config, int):
        return config
    from agentgym_lightning.metrics import json_metrics
    from agentgym_lightning.training.sft import SFTTrainer

    started = time.perf_counter()
    result = run_trainer(COMMAND, config, SFTTrainer, args.resume)
    if isinstance(result, int):
        return result
    elapsed = time.perf_counter() - started
    report = write_run_report(Path(config.output_dir))
    last = result.history[-1] if result.history else {}
    summary = {
        "steps": result.steps, "wall_time_s": elapsed, "interrupted": result.interrupted, "output_dir": str(result.output_dir),
        "report": report, "rows": last.get("data/rows"), "episodes_chosen": last.get("data/episodes/chosen"),
        "episodes_read": last.get("data/episodes/read"), "loss_first": result.history[0].get("loss") if result.history else None,
        "loss_last": last.get("loss"),
        **{f"before/{k}": v for k, v in (result.eval_before or {}).items()},
        **{f"after/{k}": v for k, v in (result.eval_after or {}).items()},
    }
    if args.json:
        print(json.dumps(json_metrics(summary)))
    else:
        print(_summary(config, result, summary))
    if result.interrupted:
        return 143 if result.signal == "SIGTERM" else 130
    return 0


def _summary(config: Any, result: Any, summary: dict[str, Any]) -> str:
    out = Path(config.output_dir)
    how = "distillation" if config.teacher else f"rejection sampling, {config.rounds} rounds" if config.rounds else "SFT"
    lines = [
        f"{how} · {config.model} ({config.backend}{', LoRA' if config.use_peft else ''}) · "
        f"{result.steps}/{config.total_steps} steps in {summary['wall_time_s']:.0f} s" + (f" (interrupted: {result.signal})" if result.interrupted else ""),
        f"  episodes          {summary['episodes_chosen'] or 0:.0f} chosen of {summary['episodes_read'] or 0:.0f} read; {summary['rows'] or 0:.0f} rows (last round)",
    ]
    if summary["loss_first"] is not None and summary["loss_last"] is not None:
        lines.append(f"  loss              {summary['loss_first']:.3f} (step 1) -> {summary['loss_last']:.3f} (step {result.steps})")
    if result.eval_before:
        after = f"{result.eval_after['eval/reward/mean']:.3f}" if result.eval_after else "-"
        lines.append(f"  held-out reward   {result.eval_before['eval/reward/mean']:.3f} -> {after}   ({int(result.eval_before['eval/episodes'])} held-out tasks)")
    if not result.interrupted:
        lines.append(f"  final model       {out / 'final'}   (RL from it: agentgym-lightning train --init-from {out})")
    lines.append(f"  checkpoints       {out / 'checkpoints'}   (continue with --resume {out})")
    lines.append(f"  rows              {out / 'rows'}")
    lines.append(f"  report            {summary['report']}")
    lines.extend(f"  {m}" for m in result.messages)
    return "\n".join(lines)
