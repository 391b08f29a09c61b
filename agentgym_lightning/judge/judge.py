"""``GroupJudge``: an LLM judge's scores as the episodes' final rewards, one call per GRPO group.

For each group of finished episodes, one call to an OpenAI-compatible judge (:mod:`.prompt`
builds what it reads; :mod:`.scores` reads its answer strictly) gives one score per episode.
Each episode's final reward becomes ``weight * score + (1 - weight) * env reward`` (the env's
verifier, if it has one; AIR rewards on its calls are untouched), and what the judge said is
kept in ``trajectory.variables["judge"]``. What a demanding run needs:

- **Bounded**: the prompt is cut to ``max_prompt_tokens``; groups are judged ``concurrency`` at
  a time, each call within ``timeout_s``; a bad answer or an error is retried up to
  ``max_attempts`` calls (a bad answer is shown back to the judge with what was wrong).
- **Never trained on when it failed**: a group whose judge never answered properly ends
  ``infra_failed`` (error ``"judge failed: ..."``), counted and warned (:class:`JudgeFailedWarning`),
  and the other groups train.
- **Cached**: scores are kept by a hash of the exact prompt, model and answer format in a JSONL
  file, so a resumed run that replays a step's episodes does not pay for them twice. A cached
  answer is checked as a fresh one is (finite, between 0 and 1): one that is not is judged again.
- **Costed**: calls, tokens, seconds, cache hits and failures per step (:meth:`take_stats`).

::

    judge = GroupJudge(JudgeConfig(base_url="http://127.0.0.1:8000/v1", model="Qwen2.5-7B-Instruct"))
    stats = judge.judge(trajectories)          # or, as groups finish: with judge.streaming(write, G) as on_done
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agentgym_lightning.judge.bounded_http import BoundedTransport
from agentgym_lightning.judge.config import JudgeConfig
from agentgym_lightning.judge.prompt import SCORES_SCHEMA, GroupPrompt, TokenCounter, approx_tokens, group_prompt
from agentgym_lightning.judge.scores import JudgeAnswerError, check_scores, scores_from_reply
from agentgym_lightning.reward_bounds import checked_reward
from agentgym_lightning.trajectory import Status, Trajectory

__all__ = ["GroupJudge", "JudgeStats", "JudgeFailedWarning", "JUDGE_FAILED_PREFIX"]

#: How the error of an episode whose group the judge could not score starts.
JUDGE_FAILED_PREFIX = "judge failed"


class JudgeFailedWarning(UserWarning):
    """A group's judge never gave a usable answer: its episodes are ``infra_failed``."""


@dataclass
class JudgeStats:
    """What judging cost and how it went, since the last :meth:`GroupJudge.take_stats`."""

    groups: int = 0
    groups_failed: int = 0
    cache_hits: int = 0
    calls: int = 0
    bad_answers: int = 0
    call_errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    call_seconds: float = 0.0
    cut_chars: int = 0

    def add(self, other: JudgeStats) -> None:
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)

    def metrics(self, prefix: str = "judge/") -> dict[str, float]:
        """These counts as ``judge/...`` metrics (what the trainer logs per step)."""
        return {f"{prefix}{name}": float(value) for name, value in asdict(self).items()}


class _Cache:
    """Scores by prompt hash, in memory and appended to a JSONL file (one line per judged group)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._scores: dict[str, list[float]] = {}
        self._lock = threading.Lock()
        if path is not None and path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    row = json.loads(line)
                    self._scores[row["key"]] = [float(s) for s in row["scores"]]
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut by a crash mid-write: that group is judged again

    def get(self, key: str) -> list[float] | None:
        with self._lock:
            return self._scores.get(key)

    def put(self, key: str, scores: list[float]) -> None:
        with self._lock:
            self._scores[key] = scores
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps({"key": key, "scores": scores}) + "\n")


class GroupJudge:
    """Scores groups of finished episodes with an LLM judge (see the module docstring).

    Args:
        config: The judge's options.
        cache_path: JSONL file of cached scores (``None``: cache in memory only). The trainer
            uses ``<output_dir>/judge_cache.jsonl``.
        count_tokens: Counts the prompt's tokens for the budget (default: 4 characters a token;
            the trainer passes the policy's tokenizer when the policy judges).
        base_url: Overrides ``config.base_url`` (the trainer's URL for the policy as judge).
        client: An ``openai.OpenAI``-like client to call (default: one made for the judge).
    """

    def __init__(
        self,
        config: JudgeConfig,
        *,
        cache_path: str | os.PathLike[str] | None = None,
        count_tokens: TokenCounter = approx_tokens,
        base_url: str | None = None,
        client: Any = None,
    ) -> None:
        self.config = config
        self.count_tokens = count_tokens
        self._cache = _Cache(Path(cache_path) if cache_path is not None else None)
        if client is None:
            url = base_url or config.base_url
            if config.is_policy and base_url is None:
                raise ValueError("the policy judges (base_url='policy'), but no URL serves it: pass base_url")
            import httpx
            import openai

            # The answer is untrusted: its decoded size is bounded and timeout_s is the whole call's deadline.
            http = httpx.Client(transport=BoundedTransport(deadline_s=config.timeout_s), timeout=config.timeout_s)
            client = openai.OpenAI(
                base_url=url, api_key=os.environ.get(config.api_key_env) or "none", timeout=config.timeout_s, max_retries=0,
                http_client=http,
            )
        self._client = client
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="judge")
        self._stats = JudgeStats()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ the public face

    def judge(self, trajectories: Sequence[Trajectory]) -> JudgeStats:
        """Score every group in ``trajectories`` (episodes sharing a ``group_id``; one without is a
        group of its own), ``concurrency`` groups at a time; returns this call's stats."""
        groups: dict[str, list[Trajectory]] = {}
        for t in trajectories:
            groups.setdefault(t.group_id or t.episode_id, []).append(t)
        stats = JudgeStats()
        for result in self._pool.map(self._judge_group, groups.values()):
            stats.add(result)
        return stats

    @contextmanager
    def streaming(self, on_trajectory: Callable[[Trajectory], Any], group_size: int) -> Iterator[Callable[[Trajectory], None]]:
        """A callback for a driver's ``on_trajectory``: episodes are held until their group's
        ``group_size`` have finished, judged in the background while the rollout goes on, then
        handed to ``on_trajectory`` with their judged rewards. Leaving the block judges the
        groups that stayed incomplete and waits for every group."""
        pending: dict[str, list[Trajectory]] = {}
        futures: list[concurrent.futures.Future[Any]] = []
        forward_lock = threading.Lock()

        def judge_then_forward(group: list[Trajectory]) -> None:
            self._judge_group(group)
            with forward_lock:  # one writer line at a time
                for t in group:
                    on_trajectory(t)

        def take(t: Trajectory) -> None:
            key = t.group_id or t.episode_id
            with forward_lock:
                members = pending.setdefault(key, [])
                members.append(t)
                if len(members) < group_size:
                    return
                del pending[key]
            futures.append(self._pool.submit(judge_then_forward, members))

        try:
            yield take
        finally:
            futures.extend(self._pool.submit(judge_then_forward, group) for group in pending.values())
            for future in futures:
                future.result()

    def take_stats(self) -> JudgeStats:
        """Everything judged since the last call (what one training step cost)."""
        with self._lock:
            stats, self._stats = self._stats, JudgeStats()
        return stats

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        close = getattr(self._client, "close", None)
        if callable(close):
            close()

    def __enter__(self) -> GroupJudge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ one group

    def _judge_group(self, group: list[Trajectory]) -> JudgeStats:
        stats = JudgeStats()
        # Only episodes a trainer may learn from are judged; already judged ones are left alone.
        episodes = sorted(
            (t for t in group if t.trainable and "judge" not in t.variables), key=lambda t: t.seed if t.seed is not None else 0
        )
        if episodes:
            stats.groups = 1
            prompt = group_prompt(episodes[0].task, episodes, self.config, self.count_tokens)
            stats.cut_chars = prompt.cut_chars
            key = self._key(prompt)
            scores = self._valid(self._cache.get(key), len(episodes))
            if scores is not None:
                stats.cache_hits = 1
                self._apply(episodes, scores, cached=True)
            else:
                scores, why = self._ask(prompt, len(episodes), stats)
                if scores is None:
                    stats.groups_failed = 1
                    self._fail(episodes, why)
                else:
                    self._cache.put(key, scores)
                    self._apply(episodes, scores, cached=False)
        with self._lock:
            self._stats.add(stats)
        return stats

    @staticmethod
    def _valid(scores: list[float] | None, n: int) -> list[float] | None:
        """Cached ``scores`` if they are what a fresh answer may be, else ``None`` (judged again):
        the cache file is read back from the run folder, so a 5.0 or a NaN there is no reward."""
        if scores is None:
            return None
        try:
            return check_scores(scores, n)
        except JudgeAnswerError:
            return None

    def _ask(self, prompt: GroupPrompt, n: int, stats: JudgeStats) -> tuple[list[float] | None, str]:
        messages = list(prompt.messages)
        why = ""
        for _ in range(self.config.max_attempts):
            stats.calls += 1
            t0 = time.perf_counter()
            try:
                reply = self._client.chat.completions.create(**self._request(messages))
            except Exception as exc:  # any transport or API error: retried, then the group fails
                stats.call_seconds += time.perf_counter() - t0
                stats.call_errors += 1
                # openai's connection error says only "Connection error.": its cause says what failed.
                cause = f" ({exc.__cause__})" if exc.__cause__ is not None and str(exc.__cause__) not in str(exc) else ""
                why = f"{type(exc).__name__}: {exc}{cause}"
                continue
            stats.call_seconds += time.perf_counter() - t0
            usage = getattr(reply, "usage", None)
            stats.prompt_tokens += int(getattr(usage, "prompt_tokens", 0) or 0)
            stats.completion_tokens += int(getattr(usage, "completion_tokens", 0) or 0)
            try:
                return scores_from_reply(reply, n, self.config.answer_format), ""
            except JudgeAnswerError as exc:
                stats.bad_answers += 1
                why = str(exc)
                answer = reply.choices[0].message.content if getattr(reply, "choices", None) else ""
                messages = [
                    *prompt.messages,
                    {"role": "assistant", "content": answer or ""},
                    {"role": "user", "content": f"That answer could not be used: {why}. Answer again with only the JSON object."},
                ]
        return None, why or "no attempt was made"

    def _request(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        cfg = self.config
        request: dict[str, Any] = {"model": cfg.model, "messages": messages, "temperature": cfg.temperature, "max_tokens": cfg.max_tokens}
        if cfg.answer_format == "json_schema":
            request["response_format"] = {"type": "json_schema", "json_schema": {"name": "scores", "schema": SCORES_SCHEMA, "strict": True}}
        elif cfg.answer_format == "tool":
            request["tools"] = [
                {
                    "type": "function",
                    "function": {"name": "submit_scores", "description": "Submit one score per episode.", "parameters": SCORES_SCHEMA},
                }
            ]
            request["tool_choice"] = {"type": "function", "function": {"name": "submit_scores"}}
        return request

    def _key(self, prompt: GroupPrompt) -> str:
        cfg = self.config
        what = {"model": cfg.model, "answer_format": cfg.answer_format, "temperature": cfg.temperature, "messages": prompt.messages}
        return hashlib.sha256(json.dumps(what, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()

    def _apply(self, episodes: list[Trajectory], scores: list[float], cached: bool) -> None:
        w = self.config.weight
        for t, score in zip(episodes, scores):
            env_reward = t.final_reward
            t.final_reward = checked_reward(w * score + (1.0 - w) * (env_reward or 0.0), "judge")
            t.variables["judge"] = {
                "score": score,
                "env_reward": env_reward,
                "weight": w,
                "model": self.config.model,
                "mode": self.config.mode,
                "cached": cached,
            }

    def _fail(self, episodes: list[Trajectory], why: str) -> None:
        warnings.warn(
            JudgeFailedWarning(
                f"the judge could not score a group of {len(episodes)} episodes after {self.config.max_attempts} "
                f"attempt(s) ({why}); they are infra_failed and not trained on"
            ),
            stacklevel=2,
        )
        for t in episodes:
            t.status = Status.INFRA_FAILED
            t.error = f"{JUDGE_FAILED_PREFIX}: {why}"
            t.final_reward = None
