"""Metrics: what is measured of finished episodes, and how metric values are written.

Episode metrics (:func:`summarize`: the summary of ``agentgym-lightning eval``, of the trainer's
rollouts and held-out evals):

* ``reward/mean`` — mean final reward of the *scored* episodes: not infrastructure failures (an
  ``infra_failed`` episode has no reward; it says nothing about the model), and not ``unscored``
  ones; ``nan`` (``null`` in ``--json``, ``n/a`` printed) when none is scored;
* ``reward/unscored`` — episodes that succeeded with no final reward at all (``None``: the env has
  no reward function and no plugin gave one); they are left out of ``reward/mean`` and
  ``success_rate`` instead of counting as 0;
* ``success_rate`` — among the scored episodes, the fraction with status ``succeeded`` *and* a
  final reward > 0 (the agent finished on its own and the task was solved). For an episode an
  LLM judge scored, success is the environment's own verdict (its reward before the judge,
  ``variables["judge"]["env_reward"]`` > 0), not the judge's score, which is a reward, not a
  verdict; an env without a reward of its own leaves the judge to say: a score of at least
  :data:`JUDGED_SUCCESS_SCORE`;
* ``turns/mean`` — LLM calls per episode;
* ``tokens_per_s`` — completion tokens of every call / wall time of the run (policy load excluded);
* ``metrics/<name>`` — the mean of each number the env put in ``trajectory.variables["metrics"]``
  (Spider reports ``official`` and ``strict`` execution accuracy there);
* ``status/<status>`` — episode counts per status; ``chat_template/mismatches`` — calls that
  continued the previous call's conversation but whose prompt ids did not extend its
  prompt+completion ids (chat-template drift); ``chat_template/rebuilt_prompts`` — calls for which
  the agent started a new conversation (their ids cannot extend; expected, e.g. Spider's checker).

The trainer's rollouts add, with :func:`episode_metrics`, the mean per-episode reward of every
source (``reward/<source>``) and the return they sum to (``reward/total``).

Metric values in JSON (:func:`json_metrics`): a NaN or infinite metric (a loss of a skipped
update, a mean over no episodes) is written as ``null``, never as the invalid JSON tokens ``NaN``
/ ``Infinity``. One rule for every writer of metrics: ``metrics.jsonl``, checkpoints'
``trainer_state.json``, the ``--json`` summaries of ``train`` and ``eval``.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from agentgym_lightning.trajectory import Status, Trajectory

__all__ = ["summarize", "pass_at_k", "succeeded", "success_meaning", "episode_metrics", "finite_or_none", "json_metrics", "JUDGED_SUCCESS_SCORE"]

#: A judged episode whose env gives no reward of its own succeeds with a judge score of at least this.
JUDGED_SUCCESS_SCORE = 0.5


def finite_or_none(value: Any) -> Any:
    """``value``, or ``None`` when it is a non-finite float."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def json_metrics(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``metrics`` with every non-finite float replaced by ``None``."""
    return {key: finite_or_none(value) for key, value in metrics.items()}


def _unscored(t: Trajectory) -> bool:
    return t.status is Status.SUCCEEDED and t.final_reward is None


def _judged(t: Trajectory) -> Mapping[str, Any] | None:
    """What an LLM judge recorded on ``t`` (``variables["judge"]``), or ``None`` if none scored it."""
    judged = t.variables.get("judge") if isinstance(t.variables, Mapping) else None
    return judged if isinstance(judged, Mapping) and "score" in judged and "env_reward" in judged else None


def succeeded(t: Trajectory) -> bool:
    """Whether an episode counts as a success: status ``succeeded`` and a positive final reward
    (what ``success_rate`` counts, and what SFT's ``success_only`` keeps). For a judged episode,
    the environment's verdict (its reward before the judge) decides, or, when the env gave no
    reward, a judge score of at least :data:`JUDGED_SUCCESS_SCORE` (:func:`success_meaning`)."""
    if t.status is not Status.SUCCEEDED:
        return False
    judged = _judged(t)
    if judged is None:
        return (t.final_reward or 0.0) > 0
    env_reward = judged["env_reward"]
    if isinstance(env_reward, (int, float)):
        return env_reward > 0
    score = judged["score"]
    return isinstance(score, (int, float)) and score >= JUDGED_SUCCESS_SCORE


def success_meaning(judged: bool) -> str:
    """What ``success_rate`` counts, in words, for a run with or without an LLM judge."""
    if not judged:
        return "status succeeded and final reward > 0"
    return (
        "status succeeded and the env's own reward > 0 (the judge's score is the reward, not a success; "
        f"an env with no reward of its own: judge score >= {JUDGED_SUCCESS_SCORE})"
    )


def pass_at_k(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Sampled success on tasks run ``k`` times each (groups of ``k`` episodes sharing a
    ``group_id``; infrastructure failures left out): ``pass@1``, the mean success over every
    judged episode, and ``pass@<k>``, the share of tasks with at least one success among their
    ``k`` (``k``: the largest group; a task with fewer judged episodes still counts, with those
    it has). ``groups_with_variance``: tasks with some successes and some failures, the groups a
    GRPO step at this temperature learns from. Success is :func:`succeeded`'s."""
    groups: dict[str, list[bool]] = {}
    for t in trajectories:
        if t.status is Status.INFRA_FAILED or _unscored(t):
            continue
        groups.setdefault(t.group_id if t.group_id is not None else t.episode_id, []).append(succeeded(t))
    if not groups:
        return {}
    k = max(len(g) for g in groups.values())
    outcomes = [s for g in groups.values() for s in g]
    return {
        "pass@1": _mean([float(s) for s in outcomes]),
        f"pass@{k}": _mean([float(any(g)) for g in groups.values()]),
        "tasks": float(len(groups)),
        "groups_with_variance": float(sum(1 for g in groups.values() if any(g) and not all(g))),
    }


def summarize(trajectories: Sequence[Trajectory], wall_time: float) -> dict[str, float]:
    """The eval metrics of finished trajectories (defined in the module docstring)."""
    n = len(trajectories)
    scored = [t for t in trajectories if t.status is not Status.INFRA_FAILED and not _unscored(t)]
    rewards = [float(t.final_reward or 0.0) for t in scored]
    successes = [succeeded(t) for t in scored]
    turns = [len(t.steps) for t in trajectories]
    completions = [s.completion for t in trajectories for s in t.steps if s.completion is not None]
    tokens = sum(len(c.completion_token_ids or []) for c in completions)
    checks = [s.prompt_extends_previous for t in trajectories for s in t.steps if s.prompt_extends_previous is not None]

    metrics: dict[str, float] = {
        "episodes": float(n),
        "reward/mean": _mean(rewards) if scored else math.nan,
        "reward/unscored": float(sum(1 for t in trajectories if _unscored(t))),
        "return/mean": _mean([t.total_reward for t in scored]) if scored else math.nan,
        "success_rate": _mean([float(s) for s in successes]) if scored else math.nan,
        "turns/mean": _mean([float(x) for x in turns]),
        "completion_tokens": float(tokens),
        "tokens_per_s": tokens / wall_time if wall_time > 0 else 0.0,
        "wall_time_s": float(wall_time),
        "chat_template/checks": float(len(checks)),
        "chat_template/mismatches": float(sum(t.template_mismatches for t in trajectories)),
        "chat_template/rebuilt_prompts": float(sum(t.prompt_rebuilds for t in trajectories)),
    }
    for status, count in sorted(Counter(t.status.value for t in trajectories).items()):
        metrics[f"status/{status}"] = float(count)
    per_variant: dict[str, list[float]] = {}
    for t in trajectories:
        variants = t.variables.get("metrics") if isinstance(t.variables, Mapping) else None
        if isinstance(variants, Mapping):
            for name, value in variants.items():
                if isinstance(value, (bool, int, float)) and not isinstance(value, complex):
                    per_variant.setdefault(str(name), []).append(float(value))
    for name, values in sorted(per_variant.items()):
        metrics[f"metrics/{name}"] = _mean(values)
    return metrics


def episode_metrics(trajectories: Sequence[Trajectory], wall_s: float, prefix: str = "") -> dict[str, float]:
    """The trainer's rollout metrics: :func:`summarize`, plus the mean per-episode reward of every
    source (``reward/<source>``, ``reward/final``) and their sum (``reward/total``, the return)."""
    metrics = {f"{prefix}{k}": v for k, v in summarize(trajectories, wall_s).items()}
    scored = [t for t in trajectories if t.status is not Status.INFRA_FAILED]
    by_source: dict[str, float] = defaultdict(float)
    for t in scored:
        for r in [r for s in t.steps for r in s.rewards] + list(t.rewards):
            by_source[r.source] += r.value
        by_source["final"] += t.final_reward or 0.0
    for source, total in sorted(by_source.items()):
        metrics[f"{prefix}reward/{source}"] = total / max(len(scored), 1)
    metrics[f"{prefix}reward/total"] = metrics.pop(f"{prefix}return/mean", 0.0)
    return metrics


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0
