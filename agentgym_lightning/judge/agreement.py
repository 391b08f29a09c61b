"""How well a judge agrees with a verifier, on episodes that have both: within-group rank agreement.

GRPO uses a group's rewards only relative to each other, so what matters is whether the judge
orders a group's episodes as the verifier does, not whether its numbers match. Two measures,
over every group with at least two judged episodes:

- **pairwise accuracy**: of the pairs the verifier tells apart, the share the judge orders the
  same way (a judge tie counts half);
- **Kendall's tau-b** per group (``scipy.stats.kendalltau``, which handles ties), averaged over
  the groups where both rankings vary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import combinations

from agentgym_lightning.trajectory import Trajectory

__all__ = ["agreement"]


def agreement(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Rank agreement between ``variables["judge"]["score"]`` and the env reward it replaced
    (``variables["judge"]["env_reward"]``); see the module docstring. Keys: ``pairwise_accuracy``,
    ``pairs``, ``kendall_tau``, ``groups`` (NaN where nothing could be compared)."""
    from scipy.stats import kendalltau

    groups: dict[str, list[tuple[float, float]]] = {}
    for t in trajectories:
        judged = t.variables.get("judge")
        if not isinstance(judged, dict) or judged.get("env_reward") is None:
            continue
        groups.setdefault(t.group_id or t.episode_id, []).append((float(judged["score"]), float(judged["env_reward"])))
    agree = pairs = 0.0
    taus: list[float] = []
    for members in groups.values():
        if len(members) < 2:
            continue
        for (ja, va), (jb, vb) in combinations(members, 2):
            if va == vb:
                continue
            pairs += 1
            if ja == jb:
                agree += 0.5
            elif (ja > jb) == (va > vb):
                agree += 1
        judge_scores = [m[0] for m in members]
        verifier = [m[1] for m in members]
        if len(set(judge_scores)) > 1 and len(set(verifier)) > 1:
            tau = kendalltau(judge_scores, verifier).statistic
            if not math.isnan(tau):
                taus.append(float(tau))
    return {
        "pairwise_accuracy": agree / pairs if pairs else math.nan,
        "pairs": pairs,
        "kendall_tau": sum(taus) / len(taus) if taus else math.nan,
        "groups": float(len(taus)),
    }
