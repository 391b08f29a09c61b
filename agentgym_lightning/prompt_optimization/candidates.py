"""Every candidate GEPA tried and its scores, one JSON line each (``candidates.jsonl``).

A GEPA callback (its ``GEPACallback`` events): the seed prompt is line 0; each later line is one
proposal of the reflection model, with

* ``candidate``: its index in GEPA's pool when it was kept, ``null`` when it was rejected;
* ``iteration``, ``parents`` (the candidate it was written from), ``texts`` (``{resource: text}``)
  and ``versions`` (``{resource: version}``, what the trajectories of its episodes record);
* ``train``: its score on the train minibatch it was proposed from, beside its parent's on the
  same tasks (``{"tasks", "parent", "candidate"}``: sums of episode returns; GEPA keeps a proposal
  that beats its parent there);
* ``heldout_score`` (mean return on the held-out tasks; kept candidates only, ``null`` for the
  rest), ``heldout_scores`` (per task), and ``best``: whether it is the best held-out so far;
* ``reflection_output``: what the reflection model answered (clipped), ``reason`` of a rejection,
  ``episodes`` run so far, ``elapsed_s``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentgym_lightning.resources import Resource

__all__ = ["CandidateLog"]

#: Characters of the reflection model's answer kept in a line.
REFLECTION_CHARS = 4000


def _versions(texts: dict[str, str]) -> dict[str, str]:
    return {name: Resource(name, text).version for name, text in texts.items()}


class CandidateLog:
    """Writes ``candidates.jsonl`` from GEPA's events (see the module docstring).

    Args:
        path: The file (truncated when the log opens).
        episodes: Returns how many episodes ran so far.
    """

    def __init__(self, path: str | Path, episodes: Callable[[], int] = lambda: 0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "w", encoding="utf-8")
        self._episodes = episodes
        self._started = time.perf_counter()
        self._best = float("-inf")
        #: Every line written, as dicts.
        self.records: list[dict[str, Any]] = []
        self._parent_scores: list[float] = []
        self._proposal: dict[str, Any] | None = None
        self._heldout: dict[int, dict[str, Any]] = {}

    # ------------------------------------------------------------------ GEPA's events

    def on_valset_evaluated(self, event: dict[str, Any]) -> None:
        scores = [float(s) for s in event["scores_by_val_id"].values()]
        held = {"heldout_score": float(event["average_score"]), "heldout_scores": scores}
        if event["iteration"] == 0:  # the seed: no proposal came before it
            self._write({
                "candidate": event["candidate_idx"], "iteration": 0, "parents": [], "texts": dict(event["candidate"]),
                "versions": _versions(dict(event["candidate"])), "train": None, "accepted": True, **held,
            })
        else:
            self._heldout[event["candidate_idx"]] = held

    def on_evaluation_end(self, event: dict[str, Any]) -> None:
        if event["has_trajectories"] and event["candidate_idx"] is not None:  # a parent on its minibatch
            self._parent_scores = [float(s) for s in event["scores"]]

    def on_candidate_selected(self, event: dict[str, Any]) -> None:
        self._proposal = {"parents": [event["candidate_idx"]]}

    def on_proposal_end(self, event: dict[str, Any]) -> None:
        raw = "\n\n".join(str(v) for v in event["raw_lm_outputs"].values())
        self._proposal = {
            **(self._proposal or {}), "texts": dict(event["new_instructions"]), "reflection_output": raw[:REFLECTION_CHARS],
        }

    def on_candidate_rejected(self, event: dict[str, Any]) -> None:
        self._write_proposal(event["iteration"], None, event["new_score"], accepted=False, reason=event["reason"])

    def on_candidate_accepted(self, event: dict[str, Any]) -> None:
        self._write_proposal(event["iteration"], event["new_candidate_idx"], event["new_score"], accepted=True,
                             parents=[p for p in event["parent_ids"] if p is not None])

    # ------------------------------------------------------------------ writing

    def _write_proposal(
        self, iteration: int, index: int | None, new_sum: float, *, accepted: bool, reason: str | None = None,
        parents: list[int] | None = None,
    ) -> None:
        proposal = self._proposal or {}
        texts = proposal.get("texts", {})
        held = {"heldout_score": None, "heldout_scores": None}
        if index is not None:
            held = self._heldout.pop(index, held)
        record: dict[str, Any] = {
            "candidate": index, "iteration": iteration, "parents": parents or proposal.get("parents", []),
            "texts": texts, "versions": _versions(texts),
            "train": {"tasks": len(self._parent_scores), "parent": sum(self._parent_scores), "candidate": float(new_sum)},
            "accepted": accepted, **held,
        }
        if reason is not None:
            record["reason"] = reason
        record["reflection_output"] = proposal.get("reflection_output", "")
        self._write(record)

    def _write(self, record: dict[str, Any]) -> None:
        score = record.get("heldout_score")
        record["best"] = score is not None and score > self._best
        if record["best"]:
            self._best = score
        record["episodes"] = self._episodes()
        record["elapsed_s"] = round(time.perf_counter() - self._started, 3)
        self.records.append(record)
        self._fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()
