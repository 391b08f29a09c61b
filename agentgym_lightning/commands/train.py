"""``agentgym-lightning train``: reinforcement learning of an agent's policy on an environment.

::

    agentgym-lightning train                                   # the embedded defaults (see README)
    agentgym-lightning train --env lightning/Spider-v0 --steps 50 --tasks-per-step 8 --group-size 4 \\
        --lora --air spider.exec_error=-0.1 --eval-env-kwarg split=dev
    agentgym-lightning train --config run.yaml --set beta=0.04
    agentgym-lightning train --resume runs/train               # continue a run from its last checkpoint
    agentgym-lightning train --init-from runs/sft              # RL from an SFT run's weights (docs/improve.md)
    agentgym-lightning train --rollout-workers 4 --retry-infra-failed   # episodes on 4 Ray actors
    agentgym-lightning train --max-staleness 1                 # rollouts go on while the update runs
    agentgym-lightning train --nproc-per-node 2 --lora          # the update on 2 ranks (FSDP2; docs/scaling.md)

Options come from, in order of precedence: the flags given, ``--config FILE.yaml`` (any
:class:`~agentgym_lightning.training.LightningRLConfig` field), the resumed run's saved config
(``--resume`` without ``--config``), the defaults. Everything is checked before the model is
loaded; a bad option is one line on stderr and exit status 2. A rollout in which every episode
failed before its first LLM call (an agent that cannot start) stops the run with exit status 1
and the first episode's error. Ctrl-C saves a checkpoint and exits 130; ``--resume`` continues
from it with the same data order (from the newest intact checkpoint: a corrupt one is passed
over, and the command says so). An ``--output-dir`` that holds a run already is refused unless
the command resumes that run (``--resume``) or starts it over (``--overwrite`` deletes its run
files, nothing else); one with less free space than a checkpoint needs is refused before the
model trains a step. At the end (also when interrupted) the run's self-contained HTML
report is written to ``<output-dir>/report.html`` (``agentgym-lightning report``) and the summary
says where.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentgym_lightning.training.trainer_protocol import RunTrainer

__all__ = [
    "register", "run", "build_config", "apply_run_options", "check_output_dir", "check_envs", "write_run_report", "parse_air", "prepare_run", "run_trainer", "RUN_FILES",
]

# flag dest -> config field, for flags that map one to one
_DIRECT = {
    "env": "env",
    "model": "model",
    "backend": "backend",
    "generator_url": "generator_url",
    "steps": "max_steps",
    "tasks_per_step": "tasks_per_step",
    "group_size": "num_generations",
    "credit": "credit",
    "aggregation": "aggregation",
    "output_dir": "output_dir",
    "eval_steps": "eval_steps",
    "eval_episodes": "eval_episodes",
    "learning_rate": "learning_rate",
    "seed": "seed",
    "loss_type": "loss_type",
    "save_steps": "save_steps",
    "rollout_workers": "rollout_workers",
    "max_staleness": "max_staleness",
    "ray_address": "ray_address",
    "agent_match": "agent_match",
    "init_from": "init_from",
}


#: The command's name and its line in ``agentgym-lightning --help`` (read without registering it).
COMMAND = "train"
HELP = "train the policy of an environment's agent with RL (LightningRL); prints reward before and after"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``train`` subcommand."""
    from agentgym_lightning.training.config import AGGREGATIONS, LOSS_TYPES, LightningRLConfig

    defaults = LightningRLConfig().to_dict()

    def h(name: str) -> str:
        """The field's help and its default (argparse's own %(default)s is None here: an unset
        flag must not override ``--config`` or the resumed run's value)."""
        text = LightningRLConfig.help_of(name).rstrip()
        return f"{text} (default: {defaults[name]})".replace("%", "%%")
    p = subparsers.add_parser(
        "train",
        help=HELP,
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Every option of the config: python -c 'from agentgym_lightning.training import LightningRLConfig; help(LightningRLConfig)'",
    )
    p.add_argument("--config", metavar="FILE.yaml", help="YAML file of config options")
    p.add_argument("--resume", metavar="DIR", help="continue the run in DIR (its newest intact checkpoint) or from one checkpoint folder")
    p.add_argument("--overwrite", action="store_true",
                   help=f"start over in an --output-dir that holds a run: deletes its run files ({', '.join(RUN_FILES)}), nothing else")
    p.add_argument("--init-from", metavar="RUN", help=h("init_from"))
    p.add_argument("--env", help=h("env"))
    p.add_argument("--model", help=h("model"))
    p.add_argument("--backend", choices=["hf", "vllm", "vllm-server"], help=h("backend"))
    p.add_argument("--generator-url", metavar="URL", help=h("generator_url"))
    p.add_argument("--steps", type=int, help=h("max_steps"))
    p.add_argument("--tasks-per-step", type=int, help=h("tasks_per_step"))
    p.add_argument("--group-size", type=int, help=h("num_generations"))
    p.add_argument("--lora", action="store_const", const=True, default=None, help=h("use_peft"))
    p.add_argument("--lora-per-agent", action="store_const", const=True, default=None,
                   help=h("lora_per_agent") + " A mapping: --set lora_per_agent='{\"writer\": \"sql\", \"rewriter\": \"sql\"}'.")
    p.add_argument("--credit", help=h("credit"))
    p.add_argument("--aggregation", choices=AGGREGATIONS, help=h("aggregation"))
    p.add_argument("--loss-type", choices=LOSS_TYPES, help=h("loss_type"))
    p.add_argument("--air", action="append", default=[], metavar="SOURCE=WEIGHT[,...]", help="AIR weights, e.g. math.tool_ok=0.2,math.no_answer=-0.2 (repeatable)")
    p.add_argument("--learning-rate", type=float, help=h("learning_rate"))
    p.add_argument("--seed", type=int, help=h("seed"))
    p.add_argument("--output-dir", help=h("output_dir"))
    p.add_argument("--save-steps", type=int, help=h("save_steps"))
    p.add_argument("--eval-steps", type=int, help=h("eval_steps"))
    p.add_argument("--eval-episodes", type=int, help=h("eval_episodes"))
    p.add_argument("--rollout-workers", type=int, metavar="N", help=h("rollout_workers"))
    p.add_argument("--max-staleness", type=int, metavar="K", help=h("max_staleness"))
    p.add_argument("--ray-address", help=h("ray_address"))
    p.add_argument("--nproc-per-node", type=int, metavar="N",
                   help="run the update on N ranks of this machine (PyTorch FSDP2; docs/scaling.md), started through torch's "
                   "elastic launcher; under torchrun or accelerate launch the ranks are the launcher's")
    p.add_argument("--agent-match", metavar="REGEX", help=h("agent_match") + " A mapping: --set agent_match='{\"role\": \"solver\"}'.")
    p.add_argument("--retry-infra-failed", action="store_const", const=True, default=None, help=h("retry_infra_failed"))
    p.add_argument("--env-kwarg", action="append", default=[], metavar="KEY=VALUE", help="training env keyword argument (repeatable; JSON values)")
    p.add_argument("--resource", action="append", default=[], metavar="NAME=@FILE|NAME=TEXT",
                   help="a resource the agent reads instead of its constant, e.g. system_prompt=@runs/gepa/system_prompt.txt "
                   "(optimize-prompt's best; repeatable): the env's `resources`, held-out eval included")
    p.add_argument("--eval-env-kwarg", action="append", default=[], metavar="KEY=VALUE", help="held-out env keyword argument (repeatable); turns the eval on")
    p.add_argument("--policy-kwarg", action="append", default=[], metavar="KEY=VALUE", help="policy backend keyword argument (repeatable)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="any config field (repeatable; JSON values), e.g. --set beta=0.04")
    judge = p.add_argument_group("LLM judge (docs/judge.md): the judge's score becomes each episode's final reward")
    judge.add_argument("--judge-base-url", metavar="URL", help="an OpenAI-compatible judge endpoint, or `policy`: the trained policy judges")
    judge.add_argument("--judge-model", metavar="NAME", help="the judge's model name (default `judge`)")
    judge.add_argument("--judge-mode", choices=["relative", "absolute"], help="rank the group's episodes against each other (default) or score each alone")
    judge.add_argument("--judge-rubric", metavar="TEXT|@FILE", help="what the judge values (default: a rubric for agents)")
    judge.add_argument("--judge-weight", type=float, metavar="W", help="final reward = W * judge + (1 - W) * env reward (default 1)")
    judge.add_argument("--judge-transcript", action="store_const", const=True, default=None, help="show the judge each episode's calls and tool calls, not only its answer")
    judge.add_argument("--judge-show-verdict", action="store_const", const=True, default=None,
                       help="show the judge the env's own verdict on each episode (`correct`, its metrics); off: hidden from it")
    p.add_argument("--no-wandb", action="store_true", help="do not log to Weights & Biases (metrics.jsonl is always written)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the final summary as one JSON object")
    p.set_defaults(func=run)


def parse_air(items: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items:
        for pair in item.split(","):
            if not pair.strip():
                continue
            source, sep, weight = pair.partition("=")
            try:
                if not sep or not source.strip():
                    raise ValueError
                out[source.strip()] = float(weight)
            except ValueError:
                raise ValueError(f"--air expects SOURCE=WEIGHT pairs, got {pair!r}") from None
    return out


def _judge_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--judge-*`` flags as ``judge`` config options; a rubric file is read now, so the
    run's saved config holds the rubric it was judged by."""
    options = {
        name: getattr(args, f"judge_{name}")
        for name in ("base_url", "model", "mode", "rubric", "weight", "transcript", "show_verdict")
        if getattr(args, f"judge_{name}", None) is not None
    }
    rubric = options.get("rubric")
    if isinstance(rubric, str) and rubric.startswith("@"):
        from agentgym_lightning.judge.config import read_rubric

        options["rubric"] = read_rubric(rubric, "--judge-rubric")
    return options


def build_config(args: argparse.Namespace) -> Any:
    """The run's :class:`LightningRLConfig` from the command line (see the module docstring)."""
    from agentgym_lightning.commands.eval import parse_kwargs
    from agentgym_lightning.resources import parse_resource_arg
    from agentgym_lightning.training.checkpoint import find_checkpoint, saved_config
    from agentgym_lightning.training.config import LightningRLConfig

    base: dict[str, Any] = {}
    if args.config:
        path = Path(args.config)
        if not path.is_file():
            raise ValueError(f"--config {path}: no such file")
        base = LightningRLConfig.from_yaml(path).to_dict()
    elif args.resume:
        checkpoint = find_checkpoint(args.resume)
        base = saved_config(checkpoint, LightningRLConfig.field_names())
    for dest, name in _DIRECT.items():
        value = getattr(args, dest)
        if value is not None:
            base[name] = value
    if args.lora:
        base["use_peft"] = True
    if args.lora_per_agent:
        base["lora_per_agent"] = True
    if args.retry_infra_failed:
        base["retry_infra_failed"] = True
    if args.air:
        base["air_weights"] = {**base.get("air_weights", {}), **parse_air(args.air)}
    if args.env_kwarg:
        base["env_kwargs"] = {**base.get("env_kwargs", {}), **parse_kwargs(args.env_kwarg, "--env-kwarg")}
    if args.resource:
        # Into env_kwargs (the held-out env's are merged over them): the run's saved config holds the texts.
        given = {r.name: r.to_dict() for r in (parse_resource_arg(item) for item in args.resource)}
        env_kwargs = base.get("env_kwargs", {})
        base["env_kwargs"] = {**env_kwargs, "resources": {**(env_kwargs.get("resources") or {}), **given}}
    if args.eval_env_kwarg:
        base["eval_env_kwargs"] = {**(base.get("eval_env_kwargs") or {}), **parse_kwargs(args.eval_env_kwarg, "--eval-env-kwarg")}
    if args.policy_kwarg:
        base["policy_kwargs"] = {**base.get("policy_kwargs", {}), **parse_kwargs(args.policy_kwarg, "--policy-kwarg")}
    judge = _judge_options(args)
    if judge:
        base["judge"] = {**(base.get("judge") or {}), **judge}
    apply_run_options(base, args)
    return LightningRLConfig.from_dict(base)


def apply_run_options(base: dict[str, Any], args: argparse.Namespace) -> None:
    """The options ``train`` and ``sft`` share, last (they win): ``--set``, ``--no-wandb``,
    ``--no-progress``, and a ``--resume`` without ``--output-dir`` writing into the run it resumes."""
    from agentgym_lightning.commands.eval import parse_kwargs
    from agentgym_lightning.training.checkpoint import find_checkpoint

    base.update(parse_kwargs(args.set, "--set"))
    if args.no_wandb:
        base["report_to"] = []
    if args.no_progress:
        base["progress"] = False
    if args.resume and not args.output_dir:
        base["output_dir"] = str(find_checkpoint(args.resume).parent.parent)


#: What a run writes in its output folder (``--overwrite`` deletes these and nothing else).
RUN_FILES = ("metrics.jsonl", "checkpoints", "trajectories", "eval", "superseded", "final", "report.html", "wandb", "wandb_run_id")


def _run_files(path: Path, files: Sequence[str] = RUN_FILES) -> list[str]:
    return [name for name in files if (path / name).exists() or (path / name).is_symlink()]


def check_output_dir(path: Path, *, resume: Path | None = None, overwrite: bool = False, files: Sequence[str] = RUN_FILES) -> None:
    """``path`` can take this run: writable, and holding no other run (``resume``: the checkpoint
    resumed, whose run may be this folder's; ``overwrite``: delete the run files found, those
    named in ``files``: the ``train`` command's by default)."""
    found = _run_files(path, files) if path.is_dir() else []
    if found and overwrite:
        for name in found:
            target = path / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            else:
                target.unlink()  # a file, or a link (never followed)
    elif found and (resume is None or resume.parent.parent.resolve() != path.resolve()):
        raise ValueError(
            f"--output-dir {path} already holds a run ({', '.join(found)}): continue it with --resume {path}, "
            "or start over with --overwrite (deletes those run files)"
        )
    probe = path / ".write-test"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"--output-dir {path} is not writable ({exc.strerror or exc})") from None


def check_envs(config: Any, *, training: bool = True) -> None:
    """Build (and close) the training env (``training``) and the held-out one with their kwargs: a
    misspelt kwarg is one line here, before the model loads, not an error later. The training env
    is built as the trainer builds it (:func:`~agentgym_lightning.training.env_factories.training_env_factory`:
    the run's AIR weights among its kwargs). (``train`` checks only the held-out env: its trainer
    builds the training env before its model, once.)"""
    from agentgym_lightning.registration import EnvKwargsError, env_kwargs_refused, make_env_factory
    from agentgym_lightning.training.env_factories import training_env_factory

    if not isinstance(config.env, str):
        return
    kinds: list[tuple[str, Mapping[str, Any]]] = [("--env-kwarg", config.env_kwargs)] if training else []
    if config.eval_env_kwargs is not None:
        kinds.append(("--eval-env-kwarg", {**config.env_kwargs, **config.eval_env_kwargs}))
    for flag, kwargs in kinds:
        factory = make_env_factory(config.env, kwargs)
        if flag == "--env-kwarg":  # as the trainer builds it: the run's AIR weights among its kwargs
            factory = training_env_factory(config.env, kwargs, config.air_weights)
            kwargs = factory.kwargs
        try:
            with env_kwargs_refused(config.env, kwargs):
                factory().close()
        except EnvKwargsError as exc:
            raise ValueError(f"{flag}: {exc}") from None

def run(args: argparse.Namespace) -> int:
    """The ``train`` command. Exit 0 when done, 130 when interrupted (Ctrl-C), 143 on SIGTERM
    (both after saving the last completed step), 2 on a bad option, 1 when the run stopped on an
    error (a dead policy backend: the last completed step is saved) or every episode of a rollout
    failed before its first LLM call."""
    config = prepare_run(COMMAND, args, build_config, training_env=False)
    if isinstance(config, int):
        return config
    if (args.nproc_per_node or 1) > 1 and "LOCAL_RANK" not in os.environ:
        return _launch_ranks(args, config)
    from agentgym_lightning.training import LightningRLTrainer

    started = time.perf_counter()
    result = run_trainer(COMMAND, config, LightningRLTrainer, args.resume)
    if isinstance(result, int):
        return result
    elapsed = time.perf_counter() - started
    report = write_run_report(Path(config.output_dir))
    before, after = result.eval_before or _logged_eval(Path(config.output_dir)) or {}, result.eval_after or {}
    if args.json:
        summary = {"steps": result.steps, "updated_steps": len(result.history) - len(_not_updated(result.history)), "wall_time_s": elapsed,
                   "interrupted": result.interrupted, "output_dir": str(result.output_dir), "report": report}
        summary.update({f"before/{k}": v for k, v in before.items()})
        summary.update({f"after/{k}": v for k, v in after.items()})
        from agentgym_lightning.metrics import json_metrics

        print(json.dumps(json_metrics(summary)))
    else:
        print(_summary(config, result, elapsed, report))
    sys.stdout.flush()  # out before anything can stop the process (a pipe holds it until exit)
    if result.interrupted:
        return 143 if result.signal == "SIGTERM" else 130
    return 0


def _launch_ranks(args: argparse.Namespace, config: Any) -> int:
    """``train --nproc-per-node N``: this same command on N ranks through torch's elastic
    launcher (the options already checked; ``--overwrite`` already done). A rank that dies stops
    the others: one line says which, and how to continue from the last checkpoint."""
    from agentgym_lightning.training.checkpoint import latest_checkpoint
    from agentgym_lightning.training.ranks import launch

    argv = list(getattr(args, "argv", None) or sys.argv[1:])
    passed: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc-per-node":
            skip = True
        elif not (arg.startswith("--nproc-per-node=") or arg == "--overwrite"):
            passed.append(arg)
    failure = launch(args.nproc_per_node, passed)
    if failure is None:
        return 0
    if failure.interrupted:  # rank 0 saved the last step and printed the summary
        return 130 if failure.signal == "SIGINT" else 143
    out = Path(config.output_dir)
    kept = latest_checkpoint(out)
    where = (
        f"its last checkpoint, {kept.name}, is kept: continue with --resume {out} --nproc-per-node {args.nproc_per_node}"
        if kept is not None else "no checkpoint was saved"
    )
    print(f"agentgym-lightning train: the run stopped: {failure}; {where}", file=sys.stderr)
    return 1


def prepare_run(
    command: str, args: argparse.Namespace, build: Callable[[argparse.Namespace], Any], *, files: Sequence[str] = RUN_FILES,
    needs_envs: Callable[[Any], bool] = lambda config: True, training_env: bool = True,
) -> Any:
    """The run's config, checked before any model loads (``train``'s and ``sft``'s): ``--resume``
    from the newest intact checkpoint (saying which it passed over), the config ``build`` makes
    of ``args``, its env id resolved, its envs built once (where ``needs_envs``; the training env
    too where ``training_env``), its output folder free for it (``files``: the command's run
    files; under a launcher rank 0 alone checks it, and ``--overwrite`` happens once). A bad option is one line on stderr
    and the exit status 2 is returned instead."""
    from agentgym_lightning.registration import resolve_env_id
    from agentgym_lightning.training.checkpoint import intact_checkpoint

    try:
        if args.overwrite and args.resume:
            raise ValueError("--overwrite starts a run over and --resume continues one: give one of them")
        resumed = None
        if args.resume:
            resumed, passed_over = intact_checkpoint(args.resume)
            for reason in passed_over:
                print(f"agentgym-lightning {command}: {reason}; resuming from {resumed}", file=sys.stderr)
            args.resume = str(resumed)
        config = build(args)
        if resumed is not None and _finished(resumed, config):
            print(_nothing_to_do(command, resumed, config))
            return 0
        config = config.replace(env=resolve_env_id(config.env))
        if needs_envs(config):
            check_envs(config, training=training_env)
        if os.environ.get("RANK", "0") == "0":
            check_output_dir(Path(config.output_dir), resume=resumed, overwrite=args.overwrite, files=files)
    except (ValueError, FileNotFoundError, ImportError) as exc:
        print(f"agentgym-lightning {command}: {exc}", file=sys.stderr)
        return 2
    return config


def _finished(checkpoint: Path, config: Any) -> bool:
    """Whether resuming ``checkpoint`` with ``config`` has nothing left to do: it is the last step
    and the run's ``final/`` model is written (without it, the resume writes it)."""
    from agentgym_lightning.training.checkpoint import checkpoint_step

    return checkpoint_step(checkpoint) >= config.max_steps and (Path(config.output_dir) / "final").is_dir()


def _nothing_to_do(command: str, checkpoint: Path, config: Any) -> str:
    """What a ``--resume`` of a finished run says instead of loading the model to do nothing."""
    from agentgym_lightning.training.checkpoint import checkpoint_step

    out = Path(config.output_dir)
    step = checkpoint_step(checkpoint)
    return (
        f"agentgym-lightning {command}: nothing to do: the run in {out} is finished ({checkpoint.name} is step {step} of "
        f"max_steps {config.max_steps}, and {out / 'final'} is written), so no model was loaded. To train on, resume it "
        f"with more steps (--resume {out} --steps {config.max_steps * 2}); to read it: agentgym-lightning report {out}"
    )


def run_trainer(command: str, config: Any, make_trainer: Callable[[Any], RunTrainer], resume: str | None) -> Any:
    """Build the trainer, check that its output folder has room for a checkpoint, and train
    (from ``resume``); returns its result, or the exit status after one line on stderr: 2 for a
    bad option (or too little room), 1 when the run stopped on an error (its last completed step
    saved) or every episode of a rollout failed before its first call."""
    from agentgym_lightning.failed_episodes import EpisodesFailedError
    from agentgym_lightning.training.checkpoint import check_checkpoint_space, checkpoint_bytes
    from agentgym_lightning.training.result import TrainingStopped

    from agentgym_lightning.registration import EnvKwargsError

    try:
        trainer = make_trainer(config)
        if not trainer.is_main_rank:  # N ranks: a follower (rank 0 checkpoints, reports and sums up)
            trainer.train()
            return 0
        adapters = trainer.adapters.names if trainer.adapters is not None else None
        try:
            # Before the first step: a run that cannot checkpoint would lose every step it trains.
            saved = trainer.checkpoints
            check_checkpoint_space(config.output_dir, checkpoint_bytes(saved.model, config.use_peft, saved.optimizer, adapters))
        except OSError as exc:
            trainer.close()
            print(f"agentgym-lightning {command}: {exc.strerror}", file=sys.stderr)
            return 2
        return trainer.train(resume_from=resume)
    except EnvKwargsError as exc:  # the trainer's training env (built before the model loads)
        print(f"agentgym-lightning {command}: --env-kwarg: {exc}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, ImportError) as exc:
        print(f"agentgym-lightning {command}: {exc}", file=sys.stderr)
        return 2
    except EpisodesFailedError as exc:
        print(f"agentgym-lightning {command}: {exc}", file=sys.stderr)
        return 1
    except TrainingStopped as exc:
        from agentgym_lightning.training.ranks import RankLostError, launcher_reports_lost_ranks

        if isinstance(exc.__cause__, RankLostError) and launcher_reports_lost_ranks():
            return 1  # its checkpoint is saved; the launcher's one line names the rank that died
        resume_hint = f"; continue with --resume {config.output_dir}" if exc.checkpoint is not None else ""
        print(f"agentgym-lightning {command}: {exc}{resume_hint}", file=sys.stderr)
        return 1


def write_run_report(output_dir: Path) -> str:
    """Write the run's ``report.html`` (interrupted runs too); returns where, or why it was not."""
    from agentgym_lightning.viewer import write_report

    path = output_dir / "report.html"
    try:
        size = write_report([str(output_dir)], str(path))
    except Exception as exc:  # noqa: BLE001 - the run is done and saved: its summary must still print
        return f"not written ({type(exc).__name__}: {exc}; write it with: agentgym-lightning report {output_dir} -o {path})"
    return f"{path} ({size / 1024:.0f} KB; live: agentgym-lightning view {output_dir})"


def _logged_eval(output_dir: Path) -> dict[str, float] | None:
    """The run's first held-out evaluation as ``metrics.jsonl`` logged it (a resumed run did not
    evaluate before training itself: the run it continues did)."""
    from agentgym_lightning.viewer.run import RunFolder

    if not output_dir.is_dir():
        return None
    records = [r for r in RunFolder(output_dir).metrics() if isinstance(r.get("eval/reward/mean"), (int, float))]
    if not records:
        return None
    first = min(records, key=lambda r: r["step"])
    return {k: v for k, v in first.items() if k.startswith("eval/") and isinstance(v, (int, float))}


#: Why a step left the model as it was, and what to try (the summary's ``updates`` line).
_NO_UPDATE = {
    "nonfinite": ("the update was not finite and was skipped", "a lower --learning-rate, or --set max_grad_norm=0.5"),
    "infra": ("every episode ended infra_failed", "the episodes' errors in trajectories/"),
    "all_failed": (
        "every episode of each group got the same reward, none solved: zero variance, nothing to learn from",
        "easier tasks or a larger model, a higher temperature (--set temperature=1.0), a larger --group-size, "
        "or AIR (--air SOURCE=WEIGHT) to reward the steps towards a solution",
    ),
    "all_solved": ("every episode of each group got the same reward, all solved: zero variance", "harder tasks"),
    "zero_variance": (
        "every episode of each group got the same reward: zero variance, nothing to learn from",
        "a higher temperature (--set temperature=1.0), a larger --group-size, or AIR (--air SOURCE=WEIGHT) to tell episodes apart",
    ),
    "no_token_ids": ("no call came with token ids: the backend returns none", "the hf or vllm backend"),
    "no_rows": ("no call was trainable", "the samples/calls/* counts in metrics.jsonl, which say why each call was left out"),
}


def _not_updated(history: Sequence[Mapping[str, float]]) -> list[str]:
    """For each step of ``history`` that did not change the model, why (a key of ``_NO_UPDATE``)."""
    reasons = []
    for h in history:
        if h.get("update/nonfinite_skipped"):
            reasons.append("nonfinite")
        elif h.get("samples/rows", 1) > 0:
            continue
        elif h.get("train/episodes") and h.get("train/status/infra_failed", 0) >= h["train/episodes"]:
            reasons.append("infra")
        elif h.get("samples/groups") and h.get("samples/groups/zero_variance", 0) >= h["samples/groups"]:
            success = h.get("train/success_rate")
            reasons.append("all_failed" if success == 0 else "all_solved" if success == 1 else "zero_variance")
        elif h.get("samples/calls/without_token_ids") and not h.get("samples/calls/trained"):
            reasons.append("no_token_ids")
        else:
            reasons.append("no_rows")
    return reasons


def _updates_lines(history: Sequence[Mapping[str, float]]) -> list[str]:
    """How many steps updated the model; when some did not, why, and when most did not, what to try."""
    if not history:
        return []
    reasons = _not_updated(history)
    text = f"  updates           {len(history) - len(reasons)} of {len(history)} steps updated the model"
    if not reasons:
        return [text]
    counts = Counter(reasons)
    lines = [text + ": " + "; ".join(f"{n} did not ({_NO_UPDATE[r][0]})" for r, n in counts.most_common())]
    if len(reasons) * 2 >= len(history):
        lines.append(f"                    try: {_NO_UPDATE[counts.most_common(1)[0][0]][1]}")
    return lines


def _judge_lines(config: Any) -> list[str]:
    """A judged run says who gave its train rewards, and what its success rate counts."""
    judge = getattr(config, "judge", None)
    if not judge:
        return []
    from agentgym_lightning.metrics import success_meaning

    return [
        f"  judge             {judge.get('model', 'judge')} at {judge.get('base_url')} ({judge.get('mode', 'relative')}, "
        f"weight {judge.get('weight', 1.0)}): train rewards are its scores, held-out rewards the env's",
        f"  success           {success_meaning(True)}",
    ]


def _async_lines(config: Any, history: Sequence[Mapping[str, float]]) -> list[str]:
    """An asynchronous run (``max_staleness`` >= 1) says what overlapped: how much of its episodes'
    time ran beside updates, how stale the calls it trained on were, and what it dropped."""
    k = getattr(config, "max_staleness", 0)
    rows = [h for h in history if "async/episodes_s" in h]
    if not k:
        return []
    if not rows:
        return [f"  asynchronous      max_staleness {k}: rollouts run during updates (no step logged it yet)"]
    ran = sum(h["async/episodes_s"] for h in rows)
    overlapped = sum(h.get("async/overlapped_s", 0.0) for h in rows)
    waited = sum(h.get("async/update_wait_s", 0.0) for h in rows)
    share = f"{overlapped / ran:.0%}" if ran > 0 else "n/a"
    stale_mean = sum(h.get("async/staleness_mean", 0.0) for h in rows) / len(rows)
    stale_max = max(int(h.get("async/staleness_max", 0.0)) for h in rows)
    dropped = int(max(h.get("async/groups_dropped_total", 0.0) for h in rows))
    return [
        f"  asynchronous      max_staleness {k}: {share} of the episodes' time ran beside updates ({overlapped:.0f} of {ran:.0f} s; "
        f"the updates waited {waited:.0f} s for theirs)",
        f"                    calls {stale_mean:.2f} versions stale on average, {stale_max} at most; "
        f"{dropped} group(s) dropped as staler than {k}",
    ]


def _summary(config: Any, result: Any, elapsed: float, report: str) -> str:
    lines = [
        f"{config.env} · {config.model} ({config.backend}{', LoRA' if config.use_peft else ''}) · "
        f"{result.steps}/{config.max_steps} steps in {elapsed:.0f} s" + (f" (interrupted: {result.signal})" if result.interrupted else "")
    ]
    lines.extend(_judge_lines(config))
    lines.extend(_async_lines(config, result.history))
    before, after = result.eval_before, result.eval_after
    if not before and after:  # a resumed run: its evaluation before training is in the log
        before = _logged_eval(Path(config.output_dir))
    if before:
        how = f"{'greedy' if config.eval_temperature == 0 else f'T={config.eval_temperature}'}, {int(before['eval/episodes'])} held-out tasks"
        after_text = f"{after['eval/reward/mean']:.3f}" if after else "-"
        lines.append(f"  held-out reward   {before['eval/reward/mean']:.3f} -> {after_text}   ({how})")
        if after:
            lines.append(f"  success rate      {before['eval/success_rate']:.3f} -> {after['eval/success_rate']:.3f}")
        k = config.eval_samples
        if k and after and f"eval/pass@{k}" in before and f"eval/pass@{k}" in after:
            lines.append(
                f"  pass@1 / pass@{k}   {before['eval/pass@1']:.3f} / {before[f'eval/pass@{k}']:.3f} -> "
                f"{after['eval/pass@1']:.3f} / {after[f'eval/pass@{k}']:.3f}   (T={config.temperature}, {k} samples a task)"
            )
    if result.history:
        first, last = result.history[0], result.history[-1]
        lines.append(f"  train reward      {first.get('train/reward/mean', float('nan')):.3f} (step 1) -> {last.get('train/reward/mean', float('nan')):.3f} (step {int(last['step'])})")
        if any(abs(h.get("train/reward/total", 0.0) - h.get("train/reward/mean", 0.0)) > 1e-12 for h in (first, last)):
            # AIR (or emitted rewards) moved the return the update saw: show it beside the task reward.
            lines.append(
                f"  with AIR          {first.get('train/reward/total', float('nan')):.3f} (step 1) -> "
                f"{last.get('train/reward/total', float('nan')):.3f} (step {int(last['step'])})   (the return trained on)"
            )
    lines.extend(_updates_lines(result.history))
    out = Path(config.output_dir)
    if not result.interrupted:
        lines.append(f"  final model       {out / 'final'}")
    elif result.steps:
        # A run stopped on purpose (a time budget, SIGTERM) is often done: say how to get its model.
        lines.append(f"  final model       not written (to end the run at step {result.steps}: --resume {out} --steps {result.steps})")
    lines.append(f"  checkpoints       {out / 'checkpoints'}   (continue with --resume {out})")
    lines.append(f"  trajectories      {out / 'trajectories'}")
    lines.append(f"  report            {report}")
    # A plugin may say a thing at the start and more of it at the end (the W&B run folder, then how
    # to upload it): the summary keeps the fuller line.
    messages = [m for m in result.messages if not any(o != m and o.startswith(m) for o in result.messages)]
    lines.extend(f"  {m}" for m in messages)
    return "\n".join(lines)
