"""``optimize_prompt``: evolve an agent's resources (its system prompt) with GEPA.

::

    from agentgym_lightning.policies import make_policy
    from agentgym_lightning.prompt_optimization import ReflectionModel, optimize_prompt

    policy = make_policy("hf")                                       # the agent's model
    reflector = ReflectionModel(make_policy("openai", "", base_url="http://127.0.0.1:8000/v1"))
    result = optimize_prompt("lightning/Arithmetic-v0", policy, reflector, output_dir="runs/gepa",
                             env_kwargs={"difficulty": 3}, heldout_env_kwargs={"split": "test"})
    result.best_texts["system_prompt"]; result.best_heldout, result.baseline_heldout

The loop is GEPA's (the ``gepa`` package, the ``optimize`` extra): pick a candidate from the Pareto
front of held-out scores, run it on a minibatch of train tasks, show the reflection model those
episodes (:mod:`.adapter`), take its new prompt, run that on the same tasks, keep it when it beats
its parent there, and then score it on every held-out task. The best candidate is the one with the
best mean held-out return. Around it, this module:

* draws the splits: ``train_tasks`` tasks of the env with ``env_kwargs`` (a seeded sample of its
  list, or draws from its task function), ``heldout_tasks`` of the env with ``heldout_env_kwargs``
  merged over them (the first ones of its list, in order, as ``eval`` runs them), and optionally
  ``test_tasks`` more held-out tasks after those, never used to choose, on which the seed and the
  best candidate are compared at the end (the held-out score that chose a candidate flatters it);
* starts from the agent's own texts: what the agent read of each resource in an episode started
  for the purpose (its default constant, or the env's resource), unless ``seed_texts`` gives them;
* writes, in ``output_dir``: ``candidates.jsonl`` (:mod:`.candidates`), ``trajectories.jsonl``
  (every episode run, each recording its resources' versions), ``<resource>.txt`` (the best text,
  for ``train --resource system_prompt=@<output_dir>/system_prompt.txt``), ``summary.json``, and
  GEPA's own state and log in ``gepa/`` (``gepa/run_log.txt``: each iteration's choices);
* stops early, with :class:`~.reflection.ReflectionFailed`, when the reflection model failed
  ``max_reflection_failures`` times in a row.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agentgym_lightning.prompt_optimization.adapter import EpisodeAdapter, _task_key, episode_score
from agentgym_lightning.prompt_optimization.candidates import CandidateLog
from agentgym_lightning.prompt_optimization.reflection import ReflectionFailed, ReflectionModel
from agentgym_lightning.registration import make_env_factory
from agentgym_lightning.resources import Resource, resource_file_name
from agentgym_lightning.trajectory import Trajectory, TrajectoryWriter

__all__ = ["optimize_prompt", "check_arguments", "PromptOptimizationResult", "draw_tasks", "read_seed_texts", "OUTPUT_FILES"]

#: What a run writes in its output folder (``overwrite`` deletes these, and the resource files).
OUTPUT_FILES = ("candidates.jsonl", "trajectories.jsonl", "summary.json", "gepa")


@dataclass
class PromptOptimizationResult:
    """What :func:`optimize_prompt` found (also ``summary.json``)."""

    #: The best candidate's texts and their versions, by resource name.
    best_texts: dict[str, str]
    best_versions: dict[str, str]
    #: Mean held-out return of the starting texts and of the best candidate.
    baseline_heldout: float
    best_heldout: float
    #: Proposals the reflection model made and that were run (rejected ones included), and how
    #: many of them were kept (scored on the held-out tasks).
    candidates_tried: int
    candidates_kept: int
    #: Episodes run in all (GEPA's metric calls), and the reflection model's questions.
    episodes: int
    reflection_calls: int
    wall_time: float
    #: Where the best texts were written, by resource name.
    files: dict[str, str] = field(default_factory=dict)
    #: The final comparison on tasks never used to choose (``test_tasks``):
    #: ``{"tasks", "baseline", "best"}``, or ``None``.
    test: dict[str, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def draw_tasks(env: Any, n: int, seed: int, *, in_order: bool, exclude: set[str] | None = None) -> list[Any]:
    """``n`` tasks of ``env`` (an ``AgentEnv``): from its list, the first ones (``in_order``) or a
    sample seeded by ``seed``; from its task function, draws with a generator seeded by ``seed``.
    Tasks whose key is in ``exclude`` are passed over. Raises ``ValueError`` when there are fewer."""
    exclude = exclude or set()
    if callable(env.tasks):
        rng = np.random.default_rng(seed)
        found: list[Any] = []
        seen = set(exclude)
        for _ in range(100 * n + 100):
            task = env.sample_task(rng)
            key = _task_key(task)
            if key not in seen:
                seen.add(key)
                found.append(task)
                if len(found) == n:
                    return found
        raise ValueError(f"{env.env_id or 'the env'} drew fewer than {n} distinct tasks; ask for fewer")
    pool = [t for t in env.tasks if _task_key(t) not in exclude]
    if len(pool) < n:
        raise ValueError(f"{env.env_id or 'the env'} has {len(pool)} tasks here (after the other split's), fewer than the {n} asked for")
    if in_order:
        return pool[:n]
    order = np.random.default_rng(seed).permutation(len(pool))[:n]
    return [pool[int(i)] for i in order]


def read_seed_texts(env: Any, names: Sequence[str], seed: int = 0) -> dict[str, str]:
    """What the agent of ``env`` reads of each resource in ``names`` before its first LLM call (its
    default, or the env's resource): an episode is started and closed, no model is asked.
    Raises ``ValueError`` naming the resources it did not read."""
    try:
        env.reset(seed=seed)
        read = env.resources_read
    finally:
        env.close()
    missing = [n for n in names if n not in read]
    if missing:
        raise ValueError(
            f"the agent of {env.env_id or 'this env'} did not read resource {', '.join(map(repr, missing))} before its "
            f"first LLM call (it read: {', '.join(sorted(read)) or 'none'}): give its starting text (--resource NAME=@FILE), or "
            "make the agent read it with ctx.resource(name, default=...)"
        )
    return {n: read[n] for n in names}


def _earlier_run(output: Path, names: Sequence[str], overwrite: bool) -> list[str]:
    """The files of an earlier optimization in ``output``; refused unless ``overwrite``."""
    found = [n for n in (*OUTPUT_FILES, *(resource_file_name(r) for r in names)) if (output / n).exists() or (output / n).is_symlink()]
    if found and not overwrite:
        raise ValueError(
            f"{output} already holds an optimization ({', '.join(found)}): choose another output folder, or "
            "overwrite it (--overwrite deletes those files)"
        )
    return found


def check_arguments(
    resources: Sequence[str],
    *,
    output_dir: str | Path | None = None,
    train_tasks: int = 32,
    heldout_tasks: int = 16,
    test_tasks: int = 0,
    budget: int = 150,
    minibatch_size: int = 3,
    concurrency: int = 8,
    max_reflection_failures: int = 3,
    overwrite: bool = False,
) -> None:
    """Every check of :func:`optimize_prompt`'s arguments that needs neither an env nor a model:
    the resource names, the sizes, the budget, ``gepa`` installed, and an earlier run in
    ``output_dir`` (refused unless ``overwrite``; nothing is deleted here). The command runs it
    before the agent's model loads. Raises ``ValueError`` (or ``ImportError``) saying what to change."""
    names = list(resources)
    if not names or len(set(names)) != len(names):
        raise ValueError(f"resources must name at least one resource, each once; got {names}")
    for name in names:
        resource_file_name(name)  # each best text is written as <name>.txt: refused before anything is touched
    for label, value, low in (("train_tasks", train_tasks, 1), ("heldout_tasks", heldout_tasks, 1), ("test_tasks", test_tasks, 0),
                              ("minibatch_size", minibatch_size, 1), ("concurrency", concurrency, 1),
                              ("max_reflection_failures", max_reflection_failures, 1)):
        if value < low:
            raise ValueError(f"{label} must be >= {low}, got {value}")
    if minibatch_size > train_tasks:
        raise ValueError(f"minibatch_size ({minibatch_size}) cannot exceed train_tasks ({train_tasks})")
    if budget < heldout_tasks + 2 * minibatch_size:
        raise ValueError(
            f"a budget of {budget} episodes tries no candidate: scoring the starting prompt takes {heldout_tasks} "
            f"(heldout_tasks) and each proposal {2 * minibatch_size} (twice minibatch_size); raise it"
        )
    if importlib.util.find_spec("gepa") is None:
        raise ImportError("prompt optimization needs the gepa package: pip install 'agentgym-lightning[optimize]'")
    if output_dir is not None and Path(output_dir).is_dir():
        _earlier_run(Path(output_dir), names, overwrite)


def _clear(output: Path, names: Sequence[str], overwrite: bool) -> None:
    found = _earlier_run(output, names, overwrite)
    for name in found:
        target = output / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink()


class _FileLog:
    """GEPA's logger, into a file only (its own ``Logger`` also tees every line to stdout)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(path, "a", encoding="utf-8")

    def log(self, message: str) -> None:
        self._fh.write(f"{message}\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def _mean(trajectories: list[Trajectory]) -> float:
    return float(np.mean([episode_score(t) for t in trajectories])) if trajectories else float("nan")


def optimize_prompt(
    env: str,
    policy: Any,
    reflection: ReflectionModel,
    *,
    output_dir: str | Path,
    resources: Sequence[str] = ("system_prompt",),
    seed_texts: Mapping[str, str] | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    heldout_env_kwargs: Mapping[str, Any] | None = None,
    train_tasks: int = 32,
    heldout_tasks: int = 16,
    test_tasks: int = 0,
    budget: int = 150,
    minibatch_size: int = 3,
    perfect_score: float = 1.0,
    concurrency: int = 8,
    seed: int = 0,
    max_reflection_failures: int = 3,
    overwrite: bool = False,
    progress: bool = False,
) -> PromptOptimizationResult:
    """Evolve ``resources`` of ``env``'s agent with GEPA (see the module docstring).

    Args:
        env: The env id (``lightning/Arithmetic-v0``).
        policy: The agent's policy (its model; not changed).
        reflection: The model that proposes new texts.
        output_dir: Where the run's files go.
        resources: The resource names to evolve (each one GEPA component).
        seed_texts: Starting texts by name (default: what the agent reads, :func:`read_seed_texts`).
        env_kwargs: The env's keyword arguments (the train split's).
        heldout_env_kwargs: Merged over ``env_kwargs`` for the held-out split (``{"split":
            "test"}``); ``None``: the same env, its held-out tasks kept apart from the train ones.
        train_tasks, heldout_tasks, test_tasks: Sizes of the splits (``test_tasks``: 0 for none).
        budget: Episodes GEPA may run (its ``max_metric_calls``; the seed's held-out score
            takes ``heldout_tasks`` of them, each proposal ``2 * minibatch_size``, each kept one
            ``heldout_tasks`` more; the last iteration may pass it).
        minibatch_size: Train tasks a proposal is written from and judged on.
        perfect_score: A parent scoring this on every minibatch task is not reflected on.
        concurrency: Episodes running at once.
        seed: Seeds the splits, the episodes and GEPA.
        max_reflection_failures: Reflection failures in a row that stop the run.
        overwrite: Replace an earlier run's files in ``output_dir``.
        progress: GEPA's progress bar.

    Raises:
        ValueError: a bad argument (checked before any episode runs).
        ReflectionFailed: the reflection model failed ``max_reflection_failures`` times in a row.
        ImportError: ``gepa`` is not installed (``pip install 'agentgym-lightning[optimize]'``).
    """
    names = list(resources)
    check_arguments(
        names, output_dir=output_dir, train_tasks=train_tasks, heldout_tasks=heldout_tasks, test_tasks=test_tasks, budget=budget,
        minibatch_size=minibatch_size, concurrency=concurrency, max_reflection_failures=max_reflection_failures, overwrite=overwrite,
    )
    import gepa

    env_kwargs = dict(env_kwargs or {})
    train_factory = make_env_factory(env, env_kwargs)
    same_env = heldout_env_kwargs is None
    heldout_kwargs = env_kwargs if same_env else {**env_kwargs, **dict(heldout_env_kwargs or {})}
    heldout_factory = train_factory if same_env else make_env_factory(env, heldout_kwargs)
    splits = _draw_splits(train_factory, heldout_factory, train_tasks, heldout_tasks, test_tasks, seed)
    seed_candidate = _seed_candidate(names, seed_texts, train_factory, seed)

    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    _clear(output, names, overwrite)
    started = time.perf_counter()
    writer = TrajectoryWriter(output / "trajectories.jsonl")
    adapter = EpisodeAdapter(
        env, policy, env_kwargs=env_kwargs, heldout_env_kwargs=heldout_kwargs, heldout_tasks=splits.heldout + splits.test,
        concurrency=concurrency, seed=seed, on_episodes=_writer_of(writer),
    )
    log = CandidateLog(output / "candidates.jsonl", episodes=lambda: adapter.episodes)
    gepa_log = _FileLog(output / "gepa" / "run_log.txt")

    try:
        result = _gepa_optimize(
            gepa, seed_candidate, splits, adapter, reflection, log, gepa_log, output, minibatch_size=minibatch_size,
            perfect_score=perfect_score, budget=budget, seed=seed, progress=progress,
            max_reflection_failures=max_reflection_failures,
        )
        best = dict(result.best_candidate)  # type: ignore[arg-type]
        test_scores = None
        if splits.test and reflection.failures_in_a_row < max_reflection_failures:
            test_scores = _test_scores(adapter, splits.test, seed_candidate, best)
    finally:
        log.close()
        gepa_log.close()
        writer.close()
    if reflection.failures_in_a_row >= max_reflection_failures:
        raise ReflectionFailed(
            f"the reflection model failed {reflection.failures_in_a_row} times in a row, so the run stopped "
            f"(candidates so far in {output / 'candidates.jsonl'}); last error: {reflection.last_error}"
        )
    files = _write_best_texts(output, best)
    summary = _summary(result, best, files, log, adapter.episodes, reflection.calls, time.perf_counter() - started, test_scores)
    (output / "summary.json").write_text(json.dumps(summary.to_dict(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return summary


def _gepa_optimize(
    gepa: Any,
    seed_candidate: dict[str, str],
    splits: _Splits,
    adapter: EpisodeAdapter,
    reflection: ReflectionModel,
    log: CandidateLog,
    gepa_log: _FileLog,
    output: Path,
    *,
    minibatch_size: int,
    perfect_score: float,
    budget: int,
    seed: int,
    progress: bool,
    max_reflection_failures: int,
) -> Any:
    """GEPA's loop from ``seed_candidate``, stopped once the reflection model has failed
    ``max_reflection_failures`` times in a row; its result."""

    def reflection_failing(state: Any) -> bool:
        return reflection.failures_in_a_row >= max_reflection_failures

    return gepa.optimize(
        seed_candidate=seed_candidate,
        trainset=splits.train,
        valset=splits.heldout,
        adapter=adapter,
        reflection_lm=reflection,
        reflection_minibatch_size=minibatch_size,
        perfect_score=perfect_score,
        max_metric_calls=budget,
        stop_callbacks=[reflection_failing],
        callbacks=[log],
        logger=gepa_log,
        run_dir=str(output / "gepa"),
        seed=seed,
        display_progress_bar=progress,
        raise_on_exception=True,
    )


@dataclass
class _Splits:
    """The tasks of one optimization: GEPA's ``train`` and ``heldout`` sets (it chooses on the
    held-out one), and the ``test`` tasks, never used to choose."""

    train: list[Any]
    heldout: list[Any]
    test: list[Any]


def _draw_splits(
    train_factory: Any, heldout_factory: Any, train_tasks: int, heldout_tasks: int, test_tasks: int, seed: int
) -> _Splits:
    """The held-out and test tasks first (the first ones of the held-out env, in order, as
    ``eval`` runs them), then a seeded draw of train tasks that are none of those."""
    heldout_env = heldout_factory()
    try:
        heldout = draw_tasks(heldout_env, heldout_tasks + test_tasks, seed + 1, in_order=True)
    finally:
        heldout_env.close()
    heldout, test = heldout[:heldout_tasks], heldout[heldout_tasks:]
    train_env = train_factory()
    try:
        train = draw_tasks(train_env, train_tasks, seed, in_order=False, exclude={_task_key(t) for t in heldout + test})
    finally:
        train_env.close()
    return _Splits(train, heldout, test)


def _seed_candidate(names: list[str], seed_texts: Mapping[str, str] | None, train_factory: Any, seed: int) -> dict[str, str]:
    """The starting texts by resource name: those given in ``seed_texts``, and for the others what
    the agent reads (:func:`read_seed_texts`). Raises ``ValueError`` for a text of no resource optimized."""
    given = dict(seed_texts or {})
    unknown = set(given) - set(names)
    if unknown:
        raise ValueError(f"seed_texts names {sorted(unknown)}, which are not among the resources optimized ({names})")
    missing = [n for n in names if n not in given]
    if missing:
        given.update(read_seed_texts(train_factory(), missing, seed))
    return {n: given[n] for n in names}


def _writer_of(writer: TrajectoryWriter) -> Callable[[list[Trajectory]], None]:
    """The adapter's ``on_episodes``: every episode run is written to ``writer``."""

    def write(trajectories: list[Trajectory]) -> None:
        for trajectory in trajectories:
            writer.write(trajectory)

    return write


def _test_scores(adapter: EpisodeAdapter, test: list[Any], seed_candidate: dict[str, str], best: dict[str, str]) -> dict[str, float]:
    """The starting texts and the best candidate compared on the ``test`` tasks (run once when they are the same)."""
    base_runs = adapter.run(test, seed_candidate)
    best_runs = base_runs if best == seed_candidate else adapter.run(test, best)
    return {"tasks": len(test), "baseline": _mean(base_runs), "best": _mean(best_runs)}


def _write_best_texts(output: Path, best: dict[str, str]) -> dict[str, str]:
    """Each best text written as ``<output>/<resource>.txt``; the files by resource name."""
    files: dict[str, str] = {}
    for name, text in best.items():
        path = output / resource_file_name(name)
        path.write_text(text + "\n", encoding="utf-8")  # read back without its newline (--resource NAME=@FILE)
        files[name] = str(path)
    return files


def _summary(
    result: Any,
    best: dict[str, str],
    files: dict[str, str],
    log: CandidateLog,
    episodes: int,
    reflection_calls: int,
    wall_time: float,
    test_scores: dict[str, float] | None,
) -> PromptOptimizationResult:
    """What the run found, from GEPA's ``result`` and the candidates ``log``."""
    proposals = [r for r in log.records if r["iteration"] > 0]
    return PromptOptimizationResult(
        best_texts=best,
        best_versions={n: Resource(n, t).version for n, t in best.items()},
        baseline_heldout=float(result.val_aggregate_scores[0]),
        best_heldout=float(result.val_aggregate_scores[result.best_idx]),
        candidates_tried=len(proposals),
        candidates_kept=sum(1 for r in proposals if r["accepted"]),
        episodes=episodes,
        reflection_calls=reflection_calls,
        wall_time=wall_time,
        files=files,
        test=test_scores,
    )
