"""GEPA's adapter over an env: a candidate prompt is scored by the episodes it produces.

A GEPA *candidate* is ``{component name: text}``; here each component is a resource of the agent
(:mod:`agentgym_lightning.resources`, ``"system_prompt"``), so evaluating a candidate on a batch
of tasks is running the env's episodes on those tasks with the candidate as the env's resources
(:func:`~agentgym_lightning.rollouts.evaluation.evaluate`, the ``eval`` command's driver) and
scoring each with the episode's return (``trajectory.total_reward``: the env's reward, plus AIR when
the env weighs it). An episode that failed in the infrastructure scores 0 and says so in its
feedback; a batch in which every episode did is a systemic failure and raises.

The reflective dataset (what the reflection model reads) is one record per episode: the task, the
agent's conversation after its system prompt (clipped: a small reflection model has a small
context), and feedback (the reward, the status, an error, the task's ``answer`` when it has one).
"""

from __future__ import annotations

import json
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentgym_lightning.env import AgentEnv
from agentgym_lightning.registration import make_env_factory
from agentgym_lightning.resources import as_resources
from agentgym_lightning.rollouts.evaluation import evaluate
from agentgym_lightning.trajectory import Status, Trajectory

__all__ = ["EpisodeAdapter", "episode_score"]

#: Characters of one message the reflection model is shown, and of one episode's conversation.
MESSAGE_CHARS = 400
TRANSCRIPT_CHARS = 1500


def episode_score(trajectory: Trajectory) -> float:
    """The score GEPA sees of one episode: its return, 0 for an infrastructure failure."""
    return 0.0 if trajectory.status is Status.INFRA_FAILED else trajectory.total_reward


def _task_key(task: Any) -> str:
    return json.dumps(task, sort_keys=True, default=repr)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _task_text(task: Any) -> str:
    if isinstance(task, Mapping) and "question" in task:
        return str(task["question"])
    return _clip(task if isinstance(task, str) else json.dumps(task, default=repr), MESSAGE_CHARS)


def _message_text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts
        content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    text = str(content or "")
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        text += f" [calls {function.get('name')}({function.get('arguments')})]"
    return f"{message.get('role')}: {_clip(text.strip(), MESSAGE_CHARS)}"


def transcript(trajectory: Trajectory) -> str:
    """The episode's conversation after its system prompt (the candidate itself): the last
    call's messages and its answer, clipped to its last :data:`TRANSCRIPT_CHARS` characters."""
    if not trajectory.steps:
        return "(the agent made no LLM call)"
    last = trajectory.steps[-1]
    lines = [_message_text(m) for m in last.request.messages if m.get("role") != "system"]
    if last.completion is not None:
        answer = last.completion.text or ""
        calls = "".join(f" [calls {c.name}({c.arguments})]" for c in last.completion.tool_calls)
        lines.append(f"assistant: {_clip((answer + calls).strip(), MESSAGE_CHARS)}")
    text = "\n".join(lines)
    return text if len(text) <= TRANSCRIPT_CHARS else "..." + text[-(TRANSCRIPT_CHARS - 3):]


def feedback(trajectory: Trajectory, score: float) -> str:
    """What the reflection model is told of one episode: its score, how it ended, the answer."""
    parts = [f"The episode scored {score:g} (higher is better; status {trajectory.status.value})."]
    if trajectory.status is Status.INFRA_FAILED:
        parts.append("It failed in the infrastructure, not through the prompt: ignore it.")
    elif trajectory.error:
        parts.append("The agent failed: " + _clip(trajectory.error.strip().splitlines()[-1], MESSAGE_CHARS))
    task = trajectory.task
    if isinstance(task, Mapping) and "answer" in task:
        parts.append(f"The correct answer is {task['answer']}.")
    return " ".join(parts)


class EpisodeAdapter:
    """GEPA's ``GEPAAdapter`` over an env (see the module docstring).

    Args:
        env: An env id (or a factory returning an ``AgentEnv``).
        policy: The agent's policy (any policy :func:`~agentgym_lightning.rollouts.evaluation.evaluate` takes).
        env_kwargs: Keyword arguments of the env (an id's); the candidate's texts are set over
            the resources it was built with.
        heldout_env_kwargs: Keyword arguments of the env that runs a batch of ``heldout_tasks``
            (the held-out split's env: ``split="test"``...); default ``env_kwargs``.
        heldout_tasks: The held-out tasks (a batch of them runs with ``heldout_env_kwargs``).
        concurrency: Episodes running at once.
        seed: Seeds every batch's episodes alike, so two candidates meet the same episodes.
        on_episodes: Called with each batch's trajectories (the optimizer writes them out).
    """

    #: GEPA's own proposer asks the reflection model (none of our own).
    propose_new_texts = None

    def __init__(
        self,
        env: Any,
        policy: Any,
        *,
        env_kwargs: Mapping[str, Any] | None = None,
        heldout_env_kwargs: Mapping[str, Any] | None = None,
        heldout_tasks: Sequence[Any] = (),
        concurrency: int = 8,
        seed: int = 0,
        on_episodes: Callable[[list[Trajectory]], None] | None = None,
    ) -> None:
        self.env = env
        self.policy = policy
        self.env_kwargs = dict(env_kwargs or {})
        self.heldout_env_kwargs = dict(self.env_kwargs if heldout_env_kwargs is None else heldout_env_kwargs)
        self.heldout_keys = {_task_key(t) for t in heldout_tasks}
        self.concurrency = concurrency
        self.seed = seed
        self.on_episodes = on_episodes
        #: Episodes run so far (GEPA's metric calls).
        self.episodes = 0

    def run(self, batch: Sequence[Any], candidate: Mapping[str, str]) -> list[Trajectory]:
        """The episodes of ``batch`` with ``candidate``'s texts as resources, in ``batch``'s order."""
        heldout = bool(batch) and all(_task_key(t) in self.heldout_keys for t in batch)
        make = make_env_factory(self.env, self.heldout_env_kwargs if heldout else self.env_kwargs)
        texts = as_resources(dict(candidate))

        def factory() -> AgentEnv:
            # Set on the env, over the resources it was built with: any env takes them, and a
            # factory as well as an id.
            env = make()
            env.resources = {**env.resources, **texts}
            return env

        result = evaluate(
            factory, self.policy, episodes=len(batch), tasks=list(batch), concurrency=self.concurrency, seed=self.seed,
            progress=False, log_metrics=False, strict=True,
        )
        self.episodes += len(result.trajectories)
        if self.on_episodes is not None:
            self.on_episodes(result.trajectories)
        by_task: dict[str, deque[Trajectory]] = defaultdict(deque)
        for trajectory in result.trajectories:
            by_task[_task_key(trajectory.task)].append(trajectory)
        ordered: list[Trajectory] = []
        for task in batch:
            found = by_task.get(_task_key(task))
            if not found:
                raise RuntimeError(f"no episode came back for task {_clip(_task_key(task), 200)}")
            ordered.append(found.popleft())
        failed = [t for t in ordered if t.status is Status.INFRA_FAILED]
        if ordered and len(failed) == len(ordered):
            lines = (failed[0].error or "").strip().splitlines()
            raise RuntimeError(
                f"all {len(failed)} episodes failed in the infrastructure, so the prompt cannot be scored; "
                f"first error: {lines[-1] if lines else 'unknown'}"
            )
        return ordered

    def evaluate(self, batch: list[Any], candidate: dict[str, str], capture_traces: bool = False) -> Any:
        """GEPA's ``evaluate``: per-task scores (and the trajectories, for reflection)."""
        from gepa.core.adapter import EvaluationBatch

        trajectories = self.run(batch, candidate)
        scores = [episode_score(t) for t in trajectories]
        outputs = [{"score": s, "status": t.status.value} for s, t in zip(scores, trajectories)]
        return EvaluationBatch(outputs=outputs, scores=scores, trajectories=trajectories if capture_traces else None)

    def make_reflective_dataset(
        self, candidate: dict[str, str], eval_batch: Any, components_to_update: list[str]
    ) -> dict[str, list[dict[str, Any]]]:
        """GEPA's ``make_reflective_dataset``: one record per episode, the same for each component."""
        records = [
            {"Task": _task_text(t.task), "Agent's conversation": transcript(t), "Feedback": feedback(t, score)}
            for t, score in zip(eval_batch.trajectories or [], eval_batch.scores)
        ]
        return {name: records for name in components_to_update}
