"""The run's LLM judge: a :class:`~agentgym_lightning.judge.GroupJudge` with its cache in the
run folder, and — when the policy judges itself (``base_url="policy"``) — the server that lets it
answer over HTTP like any other judge (:class:`~agentgym_lightning.policies.policy_server.PolicyServer`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentgym_lightning.judge import GroupJudge, JudgeConfig, JudgeStats
from agentgym_lightning.judge.prompt import approx_tokens
from agentgym_lightning.trajectory import Trajectory

__all__ = ["JudgingService", "JUDGE_CACHE"]

#: The judge's score cache in a run folder (a resumed run does not judge a replayed step again).
JUDGE_CACHE = "judge_cache.jsonl"


class JudgingService:
    """The judge a trainer uses, and what it started for it; :meth:`close` ends both."""

    def __init__(self, judge: GroupJudge, server: Any = None) -> None:
        self.judge = judge
        self._server = server

    @classmethod
    def start(cls, config: JudgeConfig, policy: Any, tokenizer: Any, output_dir: Path) -> JudgingService:
        """The judge of ``config``, caching in ``output_dir``; ``policy`` and its ``tokenizer``
        serve and count for it when the policy judges."""
        cache = Path(output_dir) / JUDGE_CACHE
        if not config.is_policy:
            return cls(GroupJudge(config, cache_path=cache))
        from agentgym_lightning.policies.policy_server import PolicyServer

        server = PolicyServer(policy).start()
        count: Callable[[str], int] = (lambda text: len(tokenizer(text).input_ids)) if tokenizer is not None else approx_tokens
        try:
            return cls(GroupJudge(config, cache_path=cache, count_tokens=count, base_url=server.base_url), server)
        except BaseException:
            server.close()
            raise

    def streaming(self, on_trajectory: Callable[..., Any], group_size: int) -> Any:
        return self.judge.streaming(on_trajectory, group_size)

    def judge_groups(self, trajectories: Sequence[Trajectory]) -> JudgeStats:
        """Judge every group of ``trajectories`` now (asynchronous training: a step's groups when
        it takes them); their rewards are set in place."""
        return self.judge.judge(trajectories)

    def take_stats(self) -> JudgeStats:
        return self.judge.take_stats()

    def close(self) -> None:
        self.judge.close()
        if self._server is not None:
            self._server.close()
            self._server = None
