"""Rewards for agents that have no verifier: an LLM judge scores each GRPO group's episodes.

- :class:`JudgeConfig` (``config.py``): every option, typed and documented.
- :func:`group_prompt` (``prompt.py``): what the judge reads, cut to a token budget.
- :func:`parse_scores` (``scores.py``): its answer, read strictly.
- :class:`GroupJudge` (``judge.py``): the calls, retries, cache, concurrency and the rewards.
- :class:`~.bounded_http.BoundedTransport` (``bounded_http.py``): its HTTP answers within a decoded
  size and a deadline.
- :func:`agreement` (``agreement.py``): rank agreement with a verifier where there is one.

See ``docs/judge.md``.
"""

from agentgym_lightning.judge.agreement import agreement
from agentgym_lightning.judge.config import DEFAULT_RUBRIC, POLICY_AS_JUDGE, JudgeConfig
from agentgym_lightning.judge.judge import JUDGE_FAILED_PREFIX, GroupJudge, JudgeFailedWarning, JudgeStats
from agentgym_lightning.judge.prompt import GroupPrompt, approx_tokens, group_prompt
from agentgym_lightning.judge.scores import JudgeAnswerError, parse_scores

__all__ = [
    "JudgeConfig",
    "DEFAULT_RUBRIC",
    "POLICY_AS_JUDGE",
    "GroupJudge",
    "JudgeStats",
    "JudgeFailedWarning",
    "JUDGE_FAILED_PREFIX",
    "GroupPrompt",
    "group_prompt",
    "approx_tokens",
    "JudgeAnswerError",
    "parse_scores",
    "agreement",
]
