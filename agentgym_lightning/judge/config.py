"""``JudgeConfig``: every option of the LLM judge, typed, defaulted and documented.

A judge scores a GRPO group's finished episodes with one call to any OpenAI-compatible endpoint
(a local vLLM, an API, or the trained policy itself). GRPO uses only the relative order of a
group's rewards, so *relative* ranking (ART's RULER: the judge sees the G episodes side by side
and spreads its scores among them) is the default; *absolute* scoring (each episode against the
rubric alone) is offered for judges that compare poorly.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["JudgeConfig", "DEFAULT_RUBRIC", "POLICY_AS_JUDGE", "JUDGE_MODES", "ANSWER_FORMATS", "GOLD_KEYS", "VERDICT_KEYS", "read_rubric"]

#: ``base_url`` value meaning "the policy being trained judges" (served to the judge over HTTP).
POLICY_AS_JUDGE = "policy"
JUDGE_MODES = ("relative", "absolute")
#: How the judge is asked to answer: plain message content holding the JSON object, a JSON-schema
#: ``response_format``, or a forced tool call (``submit_scores``) whose arguments hold it.
ANSWER_FORMATS = ("content", "json_schema", "tool")
#: Task keys that commonly hold the gold answer: never shown to the judge unless ``show_gold``.
GOLD_KEYS = ("answer", "answers", "gold", "query", "solution", "label", "labels", "target", "expected", "ground_truth", "reference")
#: Keys of an episode's result and recorded variables that hold the environment's own verdict on
#: it (Arithmetic's ``correct``, Spider's ``verdicts``, every env's ``metrics``): never shown to
#: the judge unless ``show_verdict``. The names in the episode's ``metrics`` variable are hidden too.
VERDICT_KEYS = (
    "correct", "is_correct", "solver_correct", "success", "succeeded", "passed", "reward", "score", "scores",
    "verdict", "verdicts", "reasons", "metrics", "rubric", "gold",
)

DEFAULT_RUBRIC = """\
You judge AI agents. Each episode below is one attempt by an agent at the same task.
- An episode that achieves the task's goal scores higher than one that does not.
- Between episodes that both achieve it, prefer the one whose final answer is more correct, complete and precise.
- Between episodes that both fail, prefer the one that got closer (right approach, partial result).
- Length is not quality: do not prefer an answer for being longer, and penalise made-up facts and tool results the agent did not obtain.
- An episode that errored or produced no answer scores lowest."""


#: A rubric file larger than this is not a rubric (it would not fit a judge's prompt either).
MAX_RUBRIC_BYTES = 1 << 20


def read_rubric(spec: str, what: str = "judge rubric") -> str:
    """The rubric ``@path`` names, read as UTF-8 text; ``ValueError`` naming the file and what to
    give instead when it is missing, not a regular file, too large or not text."""
    path = Path(spec[1:])
    if not path.is_file():
        raise ValueError(f"{what} {spec}: no such file (give the rubric as text, or @ a text file)")
    if path.stat().st_size > MAX_RUBRIC_BYTES:
        raise ValueError(f"{what} {spec}: {path.stat().st_size} bytes, more than a rubric's {MAX_RUBRIC_BYTES}: give a text file of the rubric")
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{what} {spec}: not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start}): give a text file of the rubric"
        ) from None


@dataclass(frozen=True)
class JudgeConfig:
    """Configuration of :class:`~agentgym_lightning.judge.GroupJudge`. Build it in Python, from
    the ``train`` command's ``--judge-*`` flags, or as the ``judge`` mapping of a run's config
    (:meth:`from_dict`); :meth:`__post_init__` names any bad value."""

    base_url: str = field(
        metadata={"help": f"The judge's OpenAI-compatible base URL (`http://127.0.0.1:8000/v1`), or `{POLICY_AS_JUDGE}`: the trained policy judges."}
    )
    model: str = field(default="judge", metadata={"help": "The model name sent to the judge endpoint."})
    api_key_env: str = field(
        default="JUDGE_API_KEY",
        metadata={"help": "Environment variable holding the judge's API key (never stored in the run's config); unset: no key."},
    )
    mode: str = field(default="relative", metadata={"help": "`relative`: rank the group's episodes against each other (RULER); `absolute`: score each alone."})
    rubric: str = field(default=DEFAULT_RUBRIC, metadata={"help": "What the judge values, in words. `@path` reads it from a file."})
    weight: float = field(
        default=1.0,
        metadata={"help": "The episode's final reward is `weight * judge + (1 - weight) * env reward` (1: the judge alone; AIR rewards are kept either way)."},
    )
    transcript: bool = field(default=False, metadata={"help": "Show the judge each episode's calls, tool calls and spans, not only its final answer."})
    max_prompt_tokens: int = field(
        default=6000, metadata={"help": "Token budget of the judge's prompt; episodes are cut to fit and the judge is told what was cut."}
    )
    show_gold: bool = field(default=False, metadata={"help": f"Show the task's gold fields ({', '.join(GOLD_KEYS)}) to the judge; off by default."})
    show_verdict: bool = field(
        default=False,
        metadata={
            "help": f"Show the judge the environment's own verdict on each episode ({', '.join(VERDICT_KEYS[:3])}, ... in its "
            "result and variables, and its `metrics`); off by default: the judge scores the answer, not the verifier's opinion of it."
        },
    )
    answer_format: str = field(default="content", metadata={"help": "`content`, `json_schema` or `tool`: how the judge returns `{\"scores\": [...]}`."})
    max_attempts: int = field(default=3, metadata={"help": "Calls per group before the group is `infra_failed` (bad answers and errors both count)."})
    timeout_s: float = field(default=120.0, metadata={"help": "Seconds one judge call may take."})
    concurrency: int = field(default=4, metadata={"help": "Groups judged at once."})
    temperature: float = field(default=0.0, metadata={"help": "The judge's sampling temperature."})
    max_tokens: int = field(default=512, metadata={"help": "The judge's answer length limit."})

    def __post_init__(self) -> None:
        if not isinstance(self.base_url, str) or not self.base_url:
            raise ValueError(f"judge base_url must be a URL or {POLICY_AS_JUDGE!r}; got {self.base_url!r}")
        if self.mode not in JUDGE_MODES:
            raise ValueError(f"judge mode must be one of {JUDGE_MODES}; got {self.mode!r}")
        if self.answer_format not in ANSWER_FORMATS:
            raise ValueError(f"judge answer_format must be one of {ANSWER_FORMATS}; got {self.answer_format!r}")
        if not (isinstance(self.weight, (int, float)) and math.isfinite(self.weight) and 0.0 <= self.weight <= 1.0):
            raise ValueError(f"judge weight must be a number in [0, 1]; got {self.weight!r}")
        for name in ("max_prompt_tokens", "max_attempts", "concurrency", "max_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"judge {name} must be a positive integer; got {value!r}")
        if not (self.timeout_s > 0):
            raise ValueError(f"judge timeout_s must be positive; got {self.timeout_s!r}")
        if self.rubric.startswith("@"):
            object.__setattr__(self, "rubric", read_rubric(self.rubric))
        if not self.rubric.strip():
            raise ValueError("judge rubric is empty: give the judge something to value, or leave the default")

    @property
    def is_policy(self) -> bool:
        """Whether the trained policy itself judges."""
        return self.base_url == POLICY_AS_JUDGE

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JudgeConfig:
        """A config from a mapping; unknown keys are an error naming the known ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown judge option(s) {unknown}; known: {sorted(known)}")
        return cls(**data)
