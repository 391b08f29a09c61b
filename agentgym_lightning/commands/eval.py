"""``agentgym-lightning eval``: run a policy on an environment and report how it did.

::

    agentgym-lightning eval --env lightning/GuessNumber-v0 --episodes 32 --output runs/guess.jsonl
    agentgym-lightning eval --env lightning/Spider-v0 --backend vllm --model Qwen/Qwen2.5-0.5B-Instruct
    agentgym-lightning eval --env lightning/Spider-v0 --backend openai --base-url http://127.0.0.1:8000/v1
    agentgym-lightning eval --config recipes/math.yaml --model runs/math        # the recipe's held-out evaluation

Episodes run through :func:`agentgym_lightning.rollouts.evaluation.evaluate` (the batched
driver, in this process); each finished trajectory is appended to ``--output`` (JSONL) at once, so Ctrl-C keeps everything that
finished and still prints the summary of it.

``--model`` may be a training run or one of its checkpoints
(:mod:`agentgym_lightning.training.weights_folder`): an intermediate step is evaluated as it is.

``--config RECIPE.yaml`` evaluates a training recipe's held-out env as its run's own evaluation does
(:mod:`agentgym_lightning.training.held_out`): its ``env``, its ``env_kwargs`` with ``eval_env_kwargs``
over them, its ``policy_kwargs``, ``eval_episodes`` tasks all at once, ``eval_temperature``,
calls capped at ``max_completion_length``, the episodes seeded from its ``seed`` plus 7919. A flag
given wins over the recipe (``--seed`` is then the run's seed, the offset still added), so a
checkpoint is scored on exactly the tasks its run's evaluations used.

Arguments are checked before the model is built (``--max-turns``, every ``--env-kwarg`` by building
one env, every ``--policy-kwarg`` against the backend's options, that ``--output`` can be
written): a mistake is one line on stderr and exit status 2. A run in which every episode is an
infrastructure failure exits with status 1 and says so; Ctrl-C exits 130.

The summary (also sent to the ``agentgym_log_metrics`` plugin hook) is
:func:`agentgym_lightning.metrics.summarize`; its metrics are defined there.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentgym_lightning.metrics import json_metrics, pass_at_k
from agentgym_lightning.trajectory import Status

if TYPE_CHECKING:
    from agentgym_lightning.rollouts.evaluation import EvalResult

__all__ = ["register", "run", "parse_kwargs", "add_server_kwargs", "check_env_kwargs"]


COMMAND = "eval"
HELP = "run a policy on an environment; print reward, success rate, turns, tokens/s"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``eval`` subcommand."""
    from agentgym_lightning.policies import BACKENDS, DEFAULT_MODEL

    p = subparsers.add_parser(
        COMMAND,
        help=HELP,
        description=(__doc__ or "").split("\n\n")[0],
    )
    p.add_argument("--env", default=None, help="environment id (lightning/GuessNumber-v0), module:Id (a module that registers Id) or path/to/file.py:make_env (a function returning an AgentEnv); required unless --config names it")
    p.add_argument(
        "--config", metavar="RECIPE.yaml", default=None,
        help="a training recipe (train's or sft's --config): evaluate its held-out env as its run does (env, env_kwargs with "
        "eval_env_kwargs over them, policy_kwargs, eval_episodes, eval_temperature, max_completion_length, seed + 7919); "
        "flags given win",
    )
    p.add_argument(
        "--model",
        default=None,
        help=f"model name, local folder or Hugging Face id, or a training run: its final/, else its newest checkpoint, "
        f"or one checkpoint folder (default: {DEFAULT_MODEL} for hf/vllm, the server's first model for openai)",
    )
    p.add_argument("--backend", choices=sorted(BACKENDS), default="hf", help="policy backend (default: %(default)s)")
    p.add_argument("--base-url", default=None, help="OpenAI-compatible server URL (openai backend only)")
    p.add_argument("--api-key", default=None, help="API key for --base-url (default: $OPENAI_API_KEY)")
    p.add_argument("--episodes", type=int, default=None, help="episodes to run in total (default: 16; --config: its eval_episodes x --group-size)")
    p.add_argument("--group-size", type=int, default=1, help="episodes per task, GRPO groups (default: %(default)s)")
    p.add_argument("--concurrency", type=int, default=None, help="episodes running at once (default: 8; --config: all of them)")
    p.add_argument(
        "--seed", type=int, default=None,
        help="seeds task order and each episode's reset (default: 0; --config: the run's seed, default the recipe's, plus 7919)",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="sample every call at this temperature, whatever the agent asked (0: greedy; default: the agent's and the backend's)",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="cap every call's max_tokens (the agent's own limit still applies when lower), as train's max_completion_length",
    )
    p.add_argument("--output", "-o", default=None, help="write trajectories here as JSONL, as they finish")
    p.add_argument("--max-turns", type=int, default=None, help="truncate episodes after this many LLM calls")
    p.add_argument(
        "--env-kwarg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keyword argument for the env (repeatable; VALUE is parsed as JSON when it can be)",
    )
    p.add_argument(
        "--policy-kwarg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keyword argument for the policy backend, e.g. device=cuda, max_batch_size=16 (repeatable)",
    )
    p.add_argument(
        "--pass-rates",
        default=None,
        metavar="FILE",
        help="write each task's attempts, successes and pass rate (of its --group-size episodes) to FILE as JSONL: "
        "a task file `train --set task_file=FILE` takes (docs/training.md, \"Groups with signal\")",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(func=run)


def parse_kwargs(items: Sequence[str], flag: str = "--env-kwarg") -> dict[str, Any]:
    """``["k=v", ...]`` → ``{"k": v}``; ``v`` is JSON when it parses (``3``, ``true``, ``[1]``)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"{flag} expects KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def _number(value: float) -> str:
    return f"{value:.4f}" if math.isfinite(value) else "n/a"


def _format_summary(args: argparse.Namespace, model: str, result: EvalResult) -> str:
    m = result.metrics
    unscored = int(m["reward/unscored"])
    lines = [
        f"{args.env} · {model or 'server default'} ({args.backend}) · "
        f"{int(m['episodes'])} episodes in {result.wall_time:.1f} s" + (" (interrupted)" if result.interrupted else ""),
        f"  mean reward       {_number(m['reward/mean'])}"
        + (f"   ({unscored} episodes unscored: no reward function and no reward plugin)" if unscored else ""),
        f"  success rate      {_number(m['success_rate'])}   (status succeeded and final reward > 0)",
        f"  mean turns        {m['turns/mean']:.2f}",
        f"  tokens/s          {m['tokens_per_s']:.1f}   ({int(m['completion_tokens'])} completion tokens)",
    ]
    if args.group_size > 1 and "pass@1" in m:
        k = args.group_size
        lines.append(
            f"  pass@1 / pass@{k}   {_number(m['pass@1'])} / {_number(m.get(f'pass@{k}', math.nan))}   "
            f"({int(m['pass/groups_with_variance'])} of {int(m['pass/tasks'])} tasks solved sometimes, not always)"
        )
    for key in sorted(k for k in m if k.startswith("metrics/")):
        lines.append(f"  {key:<17} {m[key]:.4f}")
    statuses = ", ".join(f"{k.split('/', 1)[1]} {int(v)}" for k, v in m.items() if k.startswith("status/"))
    lines.append(f"  status            {statuses or '-'}")
    if m["chat_template/checks"]:
        lines.append(
            f"  chat template     {int(m['chat_template/mismatches'])} of {int(m['chat_template/checks'])} "
            "prompts continued the conversation but not its tokens (template drift); "
            f"{int(m['chat_template/rebuilt_prompts'])} were rebuilt by the agent (expected)"
        )
    if args.output:
        lines.append(f"  wrote {args.output} ({len(result.trajectories)} trajectories)")
    if args.pass_rates:
        lines.append(f"  wrote {args.pass_rates} (each task's pass rate)")
    return "\n".join(lines)


class _UsageError(Exception):
    """A bad argument: one line on stderr, exit status 2."""


def _recipe_defaults(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """Fill the flags left unset from ``--config``'s held-out evaluation (see the module docstring),
    or from the plain defaults without it; returns the recipe's ``(env_kwargs, policy_kwargs)``,
    which the flags' kwargs go over."""
    if not args.config:
        if args.env is None:
            raise _UsageError("give the env to evaluate: --env ENV, or --config RECIPE.yaml for a recipe's held-out env")
        args.episodes = 16 if args.episodes is None else args.episodes
        args.concurrency = 8 if args.concurrency is None else args.concurrency
        args.seed = 0 if args.seed is None else args.seed
        return {}, {}
    from agentgym_lightning.training.config import LightningRLConfig
    from agentgym_lightning.training.held_out import HELD_OUT_SEED_OFFSET
    from agentgym_lightning.training.run_config import RunConfig

    path = Path(args.config)
    try:
        data = RunConfig.read_yaml(path)
    except OSError as exc:
        raise _UsageError(f"--config {path} cannot be read: {exc.strerror or 'no such file'}") from None
    except ValueError as exc:  # it names the file
        raise _UsageError(f"--config {str(exc).splitlines()[0]}") from None
    # The options every run has (an RL or an SFT recipe alike); the trainer's own are not needed here.
    shared = set(RunConfig.field_names())
    try:
        recipe = LightningRLConfig.from_dict({k: v for k, v in data.items() if k in shared})
    except (TypeError, ValueError) as exc:
        raise _UsageError(f"--config {path}: {str(exc).splitlines()[0]}") from None
    if recipe.eval_env_kwargs is None:
        raise _UsageError(f"--config {path} has no held-out env (eval_env_kwargs): set it there, or give --env and --env-kwarg")
    if args.env is None:
        args.env = recipe.env
    args.episodes = recipe.eval_episodes * args.group_size if args.episodes is None else args.episodes
    args.concurrency = args.episodes if args.concurrency is None else args.concurrency
    args.seed = (recipe.seed if args.seed is None else args.seed) + HELD_OUT_SEED_OFFSET
    if args.temperature is None:
        args.temperature = recipe.eval_temperature
    if args.max_tokens is None:
        args.max_tokens = recipe.max_completion_length
    return {**recipe.env_kwargs, **recipe.eval_env_kwargs}, dict(recipe.policy_kwargs or {})


def _check_args(args: argparse.Namespace) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """Everything that can be checked before the model is built: ``(env_id, env_kwargs,
    policy_kwargs)``; raises :class:`_UsageError`."""
    from agentgym_lightning.policies import check_policy_kwargs

    recipe_env_kwargs, recipe_policy_kwargs = _recipe_defaults(args)
    try:
        env_kwargs = {**recipe_env_kwargs, **parse_kwargs(args.env_kwarg, "--env-kwarg")}
        policy_kwargs = {**recipe_policy_kwargs, **parse_kwargs(args.policy_kwarg, "--policy-kwarg")}
    except ValueError as exc:
        raise _UsageError(str(exc)) from None
    if args.temperature is not None and not 0.0 <= args.temperature <= 2.0:
        raise _UsageError(f"--temperature must be within 0..2, got {args.temperature}")
    for name in ("episodes", "group_size", "concurrency", "max_turns", "max_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise _UsageError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.max_turns is not None:
        env_kwargs["max_turns"] = args.max_turns
    from agentgym_lightning.registration import resolve_env_id

    try:
        add_server_kwargs(args.backend, args.base_url, args.api_key, policy_kwargs)
        env_id = resolve_env_id(args.env)
        check_env_kwargs(env_id, env_kwargs)
    except ValueError as exc:
        raise _UsageError(str(exc)) from None
    try:
        check_policy_kwargs(args.backend, policy_kwargs)  # may import the backend (torch): after the cheap checks
    except ValueError as exc:
        raise _UsageError(str(exc)) from None
    for flag, path in (("--output", args.output), ("--pass-rates", args.pass_rates)):
        if path:
            _check_writable(path, flag)  # last: it creates the file
    return env_id, env_kwargs, policy_kwargs


def _check_writable(output: str, flag: str = "--output") -> None:
    """``output`` can be written: its folder is created and the file opened for appending
    (nothing in it is changed; the run truncates it when it starts)."""
    path = Path(output)
    if path.is_dir():
        raise _UsageError(f"{flag} {output} is a directory; give a file path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise _UsageError(f"{flag} {output} cannot be written: {exc.strerror or exc}") from None


def add_server_kwargs(backend: str, base_url: str | None, api_key: str | None, policy_kwargs: dict[str, Any]) -> None:
    """Put ``--base-url``/``--api-key`` into the ``openai`` backend's ``policy_kwargs``; raises
    ``ValueError`` when they are given for another backend."""
    if backend == "openai":
        if base_url:
            policy_kwargs["base_url"] = base_url
        if api_key:
            policy_kwargs["api_key"] = api_key
    elif base_url or api_key:
        raise ValueError("--base-url/--api-key only apply to --backend openai")


def check_env_kwargs(env_id: str, env_kwargs: dict[str, Any], flag: str = "--env-kwarg") -> None:
    """Build (and close) one env with ``env_kwargs``: an unknown or bad one fails here, cheaply,
    with a ``ValueError`` naming ``flag``."""
    import gymnasium as gym

    from agentgym_lightning.registration import make_env_factory

    try:
        env = make_env_factory(env_id, env_kwargs)()  # its warnings (data skipped...) show here, once
    except (TypeError, ValueError, gym.error.Error) as exc:
        message = str(exc).split(" was raised from the environment creator")[0]
        raise ValueError(f"{flag}: {env_id} does not accept {env_kwargs}: {message}") from None
    env.close()


def run(args: argparse.Namespace) -> int:
    """The ``eval`` command: check the arguments, build the policy, run, print the summary.

    Exit status: 0, 2 for a bad argument, 1 when every episode was an infrastructure failure or
    ``--output`` could not be written (a full disk: the summary is still printed), 130 if
    interrupted.
    """
    from agentgym_lightning.policies import DEFAULT_MODEL, make_policy
    from agentgym_lightning.training.weights_folder import holds_run_weights, weights_model_folder

    try:
        env_id, env_kwargs, policy_kwargs = _check_args(args)
    except _UsageError as exc:
        print(f"agentgym-lightning eval: {exc}", file=sys.stderr)
        return 2
    model = args.model if args.model is not None else ("" if args.backend == "openai" else DEFAULT_MODEL)
    with ExitStack() as stack:
        try:
            folder = model
            if args.backend != "openai" and holds_run_weights(model):
                # A run or one of its checkpoints: its weights, in a folder that lasts while they are used.
                folder = str(stack.enter_context(weights_model_folder(model)))
            policy = make_policy(args.backend, folder, **policy_kwargs)
        except (ImportError, ValueError, FileNotFoundError) as exc:
            print(f"agentgym-lightning eval: {exc}", file=sys.stderr)
            return 2
        return _evaluate(args, env_id, env_kwargs, policy, model)


def _evaluate(args: argparse.Namespace, env_id: str, env_kwargs: dict[str, Any], policy: Any, model: str) -> int:
    """Run ``policy`` (closed at the end), write what was asked for, print the summary; the exit status."""
    from agentgym_lightning.rollouts.evaluation import evaluate
    from agentgym_lightning.training.pass_rates import write_pass_rates

    owned = policy  # a wrapper leaves the policy it wraps open: this is what closes
    if args.temperature is not None or args.max_tokens is not None:
        from agentgym_lightning.training.generation import SamplingOverride

        policy = SamplingOverride(policy, temperature=args.temperature, max_tokens=args.max_tokens)
    try:
        result = evaluate(
            env_id,
            policy,
            episodes=args.episodes,
            group_size=args.group_size,
            concurrency=args.concurrency,
            seed=args.seed,
            output=args.output,
            env_kwargs=env_kwargs,
            progress=not args.no_progress,
        )
    finally:
        owned.close()
    if args.group_size > 1:
        result.metrics.update({(name if name.startswith("pass@") else f"pass/{name}"): value for name, value in pass_at_k(result.trajectories).items()})
    if args.pass_rates:
        write_pass_rates(args.pass_rates, result.trajectories)
    if args.json:
        print(json.dumps(json_metrics(result.metrics)))
    else:
        print(_format_summary(args, model, result))
    if result.interrupted:
        return 130
    if result.output_error is not None:
        print(f"agentgym-lightning eval: {result.output_error}; the trajectories after it were not saved", file=sys.stderr)
        return 1
    failed = [t for t in result.trajectories if t.status is Status.INFRA_FAILED]
    if result.trajectories and len(failed) == len(result.trajectories):
        first = (failed[0].error or "").strip().splitlines()
        print(
            f"agentgym-lightning eval: all {len(failed)} episodes failed in the infrastructure (infra_failed), "
            f"so there is no result; first error: {first[-1] if first else 'unknown'}",
            file=sys.stderr,
        )
        return 1
    return 0

