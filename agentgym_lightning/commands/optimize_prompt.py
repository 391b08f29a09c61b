"""``agentgym-lightning optimize-prompt``: evolve an agent's system prompt with GEPA, no training.

::

    agentgym-lightning optimize-prompt --env lightning/Arithmetic-v0 --env-kwarg difficulty=3 \\
        --heldout-env-kwarg split=test --reflection-base-url http://127.0.0.1:8000/v1 --output-dir runs/gepa
    agentgym-lightning optimize-prompt --env lightning/Arithmetic-v0 --reflection-base-url policy   # the agent's own model reflects
    agentgym-lightning train --resource system_prompt=@runs/gepa/system_prompt.txt ...             # RL from the best prompt

The agent runs with the ``--backend``/``--model`` policy (as ``eval``); a reflection model (any
OpenAI-compatible server, or ``policy``: the agent's own) reads episodes of the current prompt on
train tasks and writes a new one; GEPA keeps a new prompt that beats its parent on those tasks and
chooses among the kept ones by their held-out score
(:func:`agentgym_lightning.prompt_optimization.optimize_prompt`). ``--resource NAME`` picks what
evolves (default ``system_prompt``, starting from the agent's own text; ``NAME=@FILE`` starts from
FILE). The output folder gets ``candidates.jsonl`` (every candidate and its scores),
``trajectories.jsonl``, ``<NAME>.txt`` (the best text) and ``summary.json``; ``docs/prompt-optimization.md``.

A bad argument is one line on stderr and exit status 2, found before any model loads where it
can be; a reflection model that keeps failing stops the run with status 1.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

__all__ = ["register", "run"]

COMMAND = "optimize-prompt"
HELP = "evolve an agent's system prompt with GEPA (reflection by any OpenAI-compatible model), scored by the env's reward"

#: ``--reflection-base-url`` naming the agent's own policy as the reflection model.
POLICY_REFLECTS = "policy"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``optimize-prompt`` subcommand."""
    from agentgym_lightning.policies import BACKENDS, DEFAULT_MODEL

    p = subparsers.add_parser(COMMAND, help=HELP, description=(__doc__ or "").split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", required=True, help="environment id, module:Id or path/to/file.py:make_env (as for eval)")
    p.add_argument("--env-kwarg", action="append", default=[], metavar="KEY=VALUE", help="env keyword argument (repeatable; JSON values)")
    p.add_argument("--heldout-env-kwarg", action="append", default=[], metavar="KEY=VALUE",
                   help="held-out env keyword argument, merged over --env-kwarg (e.g. split=test; repeatable); "
                   "without any, held-out tasks are drawn from the same env, apart from the train ones")
    p.add_argument("--resource", action="append", default=[], metavar="NAME[=@FILE|=TEXT]",
                   help="the resource to evolve (repeatable; default system_prompt), from the agent's own text or from FILE/TEXT")
    p.add_argument("--backend", choices=sorted(BACKENDS), default="hf", help="the agent's policy backend (default: %(default)s)")
    p.add_argument("--model", default=None, help=f"the agent's model (default: {DEFAULT_MODEL} for hf/vllm)")
    p.add_argument("--base-url", default=None, help="the agent's OpenAI-compatible server (--backend openai)")
    p.add_argument("--api-key", default=None, help="API key for --base-url")
    p.add_argument("--policy-kwarg", action="append", default=[], metavar="KEY=VALUE",
                   help="the agent's policy keyword argument, e.g. default_temperature=0 (repeatable)")
    r = p.add_argument_group("reflection model")
    r.add_argument("--reflection-base-url", required=True, metavar="URL|policy",
                   help="its OpenAI-compatible server, or `policy`: the agent's own model reflects")
    r.add_argument("--reflection-model", default="", help="its model name on the server (default: the server's first)")
    r.add_argument("--reflection-api-key", default=None, help="API key for --reflection-base-url (default: $OPENAI_API_KEY)")
    r.add_argument("--reflection-temperature", type=float, default=0.7, help="(default: %(default)s)")
    r.add_argument("--reflection-max-tokens", type=int, default=512, help="(default: %(default)s)")
    s = p.add_argument_group("search")
    s.add_argument("--train-tasks", type=int, default=32, help="train tasks proposals are written from (default: %(default)s)")
    s.add_argument("--heldout-tasks", type=int, default=16, help="held-out tasks candidates are chosen by (default: %(default)s)")
    s.add_argument("--test-tasks", type=int, default=0,
                   help="more held-out tasks, never used to choose, to compare the start and the best on at the end (default: %(default)s)")
    s.add_argument("--budget", type=int, default=150, help="episodes GEPA may run (default: %(default)s)")
    s.add_argument("--minibatch-size", type=int, default=3, help="train tasks per proposal (default: %(default)s)")
    s.add_argument("--perfect-score", type=float, default=1.0, help="a parent scoring this on every minibatch task is not reflected on (default: %(default)s)")
    s.add_argument("--concurrency", type=int, default=8, help="episodes running at once (default: %(default)s)")
    s.add_argument("--seed", type=int, default=0, help="seeds the splits, the episodes and GEPA (default: %(default)s)")
    p.add_argument("--output-dir", default="runs/optimize-prompt", help="where the run's files go (default: %(default)s)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier run's files in --output-dir")
    p.add_argument("--progress", action="store_true", help="GEPA's progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(func=run)


class _UsageError(Exception):
    """A bad argument: one line on stderr, exit status 2."""


def _resources(items: list[str]) -> tuple[list[str], dict[str, str]]:
    """``--resource`` values: the names to evolve, and the starting texts given."""
    from agentgym_lightning.resources import parse_resource_arg, resource_file_name

    names: list[str] = []
    seeds: dict[str, str] = {}
    for item in items or ["system_prompt"]:
        if "=" in item:
            resource = parse_resource_arg(item)
            names.append(resource.name)
            seeds[resource.name] = resource.text
        else:
            if not item.strip():
                raise ValueError("--resource needs a name: --resource system_prompt")
            names.append(item.strip())
    if len(set(names)) != len(names):
        raise ValueError(f"--resource names a resource twice: {names}")
    for name in names:
        resource_file_name(name)  # the best text is written as <name>.txt in --output-dir
    return names, seeds


#: The search's Python argument names, as the flags a user of the command typed.
_FLAGS = ("train_tasks", "heldout_tasks", "test_tasks", "minibatch_size", "concurrency")


def _as_flags(message: str) -> str:
    """``message`` with the search's argument names written as their flags (``--train-tasks``)."""
    return re.sub(r"\b(" + "|".join(_FLAGS) + r")\b", lambda m: "--" + m.group(1).replace("_", "-"), message)


def _check_args(args: argparse.Namespace) -> dict[str, Any]:
    """Everything checked before a model loads (the flags, the search's sizes and budget, an
    earlier run in ``--output-dir``, the env's kwargs, and the starting text of each resource,
    read from an episode started without a model); raises :class:`_UsageError`."""
    from agentgym_lightning.commands.eval import add_server_kwargs, check_env_kwargs, parse_kwargs
    from agentgym_lightning.policies import check_policy_kwargs
    from agentgym_lightning.prompt_optimization.optimize import check_arguments, read_seed_texts
    from agentgym_lightning.registration import make_env_factory, resolve_env_id

    try:
        names, seeds = _resources(args.resource)
        env_kwargs = parse_kwargs(args.env_kwarg, "--env-kwarg")
        heldout = parse_kwargs(args.heldout_env_kwarg, "--heldout-env-kwarg") if args.heldout_env_kwarg else None
        policy_kwargs = parse_kwargs(args.policy_kwarg, "--policy-kwarg")
        add_server_kwargs(args.backend, args.base_url, args.api_key, policy_kwargs)
        env_id = resolve_env_id(args.env)
    except ValueError as exc:
        raise _UsageError(str(exc)) from None
    if args.reflection_base_url != POLICY_REFLECTS and not args.reflection_base_url.startswith(("http://", "https://")):
        raise _UsageError(f"--reflection-base-url must be an http(s) URL or `{POLICY_REFLECTS}`, got {args.reflection_base_url!r}")
    if args.reflection_base_url == POLICY_REFLECTS and (args.reflection_model or args.reflection_api_key):
        raise _UsageError(f"--reflection-model/--reflection-api-key need a --reflection-base-url server, not `{POLICY_REFLECTS}`")
    if args.reflection_max_tokens < 1 or args.reflection_temperature < 0:
        raise _UsageError("--reflection-max-tokens must be >= 1 and --reflection-temperature >= 0")
    try:
        # Before the model: a bad size or an occupied folder costs nothing to find (loading it took 75 s).
        check_arguments(
            names, output_dir=args.output_dir, train_tasks=args.train_tasks, heldout_tasks=args.heldout_tasks,
            test_tasks=args.test_tasks, budget=args.budget, minibatch_size=args.minibatch_size, concurrency=args.concurrency,
            overwrite=args.overwrite,
        )
        check_env_kwargs(env_id, env_kwargs)
        if heldout is not None:
            check_env_kwargs(env_id, {**env_kwargs, **heldout}, "--heldout-env-kwarg")
        check_policy_kwargs(args.backend, policy_kwargs)
        missing = [n for n in names if n not in seeds]
        if missing:  # what the agent reads, from an episode started and closed with no model asked
            seeds.update(read_seed_texts(make_env_factory(env_id, env_kwargs)(), missing, args.seed))
    except (ValueError, ImportError) as exc:
        raise _UsageError(_as_flags(str(exc))) from None
    return {"env_id": env_id, "names": names, "seeds": seeds, "env_kwargs": env_kwargs, "heldout": heldout,
            "policy_kwargs": policy_kwargs}


def _format(result: Any, output_dir: str) -> str:
    lines = [
        f"held-out mean return  start {result.baseline_heldout:.4f}  ->  best {result.best_heldout:.4f}",
        f"candidates            {result.candidates_tried} proposed, {result.candidates_kept} kept; "
        f"{result.episodes} episodes, {result.reflection_calls} reflection calls, {result.wall_time:.1f} s",
    ]
    if result.test is not None:
        lines.append(f"test ({int(result.test['tasks'])} tasks)       start {result.test['baseline']:.4f}  ->  best {result.test['best']:.4f}")
    for name, path in result.files.items():
        lines.append(f"best {name}: {path}  (train --resource {name}=@{path})")
    lines.append(f"every candidate's scores: {output_dir}/candidates.jsonl")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """The ``optimize-prompt`` command. Exit status: 0, 2 for a bad argument, 1 when the run
    failed (the reflection model kept failing, every episode failed), 130 if interrupted."""
    from agentgym_lightning.policies import DEFAULT_MODEL, make_policy
    from agentgym_lightning.prompt_optimization import ReflectionFailed, ReflectionModel, optimize_prompt

    def fail(message: str, status: int) -> int:
        print(f"agentgym-lightning {COMMAND}: {message}", file=sys.stderr)
        return status

    try:
        checked = _check_args(args)
    except _UsageError as exc:
        return fail(str(exc), 2)
    model = args.model if args.model is not None else ("" if args.backend == "openai" else DEFAULT_MODEL)
    try:
        policy = make_policy(args.backend, model, **checked["policy_kwargs"])
    except (ImportError, ValueError, FileNotFoundError) as exc:
        return fail(str(exc), 2)
    reflector_policy = None
    try:
        if args.reflection_base_url == POLICY_REFLECTS:
            reflection = ReflectionModel(policy, temperature=args.reflection_temperature, max_tokens=args.reflection_max_tokens)
        else:
            reflector_policy = make_policy("openai", args.reflection_model, base_url=args.reflection_base_url,
                                           api_key=args.reflection_api_key, return_token_ids=False, logprobs=False)
            reflection = ReflectionModel(reflector_policy, temperature=args.reflection_temperature,
                                         max_tokens=args.reflection_max_tokens)
        result = optimize_prompt(
            checked["env_id"], policy, reflection, output_dir=args.output_dir, resources=checked["names"],
            seed_texts=checked["seeds"], env_kwargs=checked["env_kwargs"], heldout_env_kwargs=checked["heldout"],
            train_tasks=args.train_tasks, heldout_tasks=args.heldout_tasks, test_tasks=args.test_tasks, budget=args.budget,
            minibatch_size=args.minibatch_size, perfect_score=args.perfect_score, concurrency=args.concurrency,
            seed=args.seed, overwrite=args.overwrite, progress=args.progress,
        )
    except (ValueError, ImportError) as exc:
        return fail(str(exc), 2)
    except (ReflectionFailed, RuntimeError) as exc:
        return fail(str(exc), 1)
    finally:
        policy.close()
        if reflector_policy is not None:
            reflector_policy.close()
    if args.json:
        print(json.dumps(result.to_dict(), ensure_ascii=False))
    else:
        print(_format(result, args.output_dir))
    return 0
