"""From chosen episodes to SFT rows: one row per trained LLM call, the loss on its completion.

A row is a :class:`~agentgym_lightning.training.samples.Sample` as RL's are (so the same token-tree
micro-batches run it): the call's recorded ``prompt_ids`` and ``completion_ids``, every completion
token in the loss, weight 1 (the step's loss is the mean over its completion tokens). Which calls
train is decided as RL decides it (:func:`~agentgym_lightning.training.samples.untrained_reason`):
not calls the agent or env marked untrainable, nor those ``agent_match`` leaves out, nor (with an
adapter per agent) calls of agents without an adapter, nor empty completions. A call recorded
without token ids (an API backend's: a teacher's) is re-tokenized with the student's chat template
(:mod:`.retokenize`) under ``retokenize="auto"``, every call under ``"always"``, none under
``"never"`` (then it is left out). The counts say what happened to each call (``data/calls/...``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentgym_lightning.agent_match import AgentMatchSpec, as_agent_match
from agentgym_lightning.episode import untrainable_reason
from agentgym_lightning.training.agent_adapters import AgentAdapters
from agentgym_lightning.training.samples import Sample, untrained_reason
from agentgym_lightning.training.sft.retokenize import retokenize_call
from agentgym_lightning.trajectory import Step, Trajectory

__all__ = ["SFTRows", "sft_rows", "row_record"]

_NAN = float("nan")


@dataclass
class SFTRows:
    """The rows of the chosen episodes, and what happened to each call (counts)."""

    samples: list[Sample] = field(default_factory=list)
    counts: dict[str, float] = field(default_factory=dict)


def sft_rows(
    episodes: Sequence[Trajectory],
    *,
    tokenizer: Any = None,
    agent_match: AgentMatchSpec | None = None,
    adapters: AgentAdapters | None = None,
    retokenize: str = "auto",
    tool_prompt: str = "full",
) -> SFTRows:
    """The SFT rows of ``episodes`` (see the module docstring); ``tokenizer``: the student's, for
    the calls re-tokenized (needed only when some are)."""
    if retokenize not in ("auto", "always", "never"):
        raise ValueError(f"retokenize must be auto, always or never; got {retokenize!r}")
    matches = [m for m in (as_agent_match(agent_match), adapters.trains if adapters is not None else None) if m is not None]
    match: Callable[[Step], bool] | None = (lambda step: all(m(step) for m in matches)) if matches else None
    counts: dict[str, float] = defaultdict(float)
    samples: list[Sample] = []
    for t in episodes:
        for step in t.steps:
            if step.completion is None:
                continue
            reason = untrainable_reason(step, match)
            metadata: dict[str, Any] = {}
            prompt = completion = None
            if reason is None:
                recorded = untrained_reason(step, False, match)
                if retokenize == "always" or (retokenize == "auto" and recorded == "without_token_ids"):
                    if tokenizer is None:
                        raise ValueError("calls without token ids need the student's tokenizer to be re-tokenized")
                    call = retokenize_call(tokenizer, step, tool_prompt)
                    prompt, completion, metadata = call.prompt_ids, call.completion_ids, call.metadata
                    counts["calls/retokenized"] += 1
                elif recorded is not None:
                    reason = recorded
                else:
                    prompt, completion = list(step.completion.prompt_token_ids or []), list(step.completion.completion_token_ids or [])
            if reason is None and not completion:
                reason = "empty"
            if reason is not None:
                counts[f"calls/{reason}"] += 1
                continue
            assert prompt is not None and completion is not None
            counts["calls/trained"] += 1
            n = len(completion)
            samples.append(Sample(
                prompt_ids=prompt, completion_ids=completion, loss_mask=[1] * n, sampling_logprobs=[_NAN] * n,
                advantages=[1.0] * n, weight=1.0, episode_id=t.episode_id, group_id=t.group_id, steps=[step.index],
                adapter=adapters.adapter_of(step) if adapters is not None else None, metadata=metadata,
            ))
    counts["rows"] = float(len(samples))
    counts["loss_tokens"] = float(sum(s.num_loss_tokens for s in samples))
    return SFTRows(samples=samples, counts=dict(counts))


def row_record(row: Sample) -> dict[str, Any]:
    """A row as the run writes it (``rows/round-NN.jsonl``): what was trained on, ids and all,
    with its metadata (a re-tokenized row says so)."""
    return {
        "episode_id": row.episode_id,
        "steps": row.steps,
        "adapter": row.adapter,
        "prompt_ids": row.prompt_ids,
        "completion_ids": row.completion_ids,
        "loss_tokens": row.num_loss_tokens,
        **row.metadata,
    }
