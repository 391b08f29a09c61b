"""From episodes to training samples: LightningRL's credit assignment and aggregation.

An episode is a list of LLM calls; the policy-gradient loss wants rows of token ids. This module
does the one translation between them, in three moves:

1. **Values.** A credit-assignment strategy (a plugin, :func:`~agentgym_lightning.credit.assign_credit`)
   gives every call of an episode a value: ``identical`` gives each call the episode's return
   (LightningRL), ``discounted`` the return-to-go, ``final-only`` the call's own rewards.
2. **Advantages, normalised at the level of episodes.** Within the task's group (the
   ``num_generations`` episodes of one task), each episode counts once — as the mean of its calls'
   values — in the group's mean ``mu`` and standard deviation ``sigma`` (sample std, as TRL). A call's
   advantage is ``(value - mu) / (sigma + 1e-4)`` (``scale_rewards="group"``; ``"batch"`` takes
   ``sigma`` over the whole step, ``"none"`` does not divide). With ``identical`` this is exactly
   GRPO's advantage, shared by every call of the episode.
3. **Rows.** ``transition`` (the paper's): every trainable call is a row — its own prompt ids and
   completion ids, with the logprobs the generator reported. ``trajectory``: a call whose prompt
   ids start with the previous call's prompt+completion ids is appended to that row (the new
   tokens in between — tool results, the user's turn — are in the row but masked out of the loss);
   where the prompt does not extend it (an agent that rebuilds its prompt, a template that
   re-renders history), a new row starts. Merges and fallbacks are counted.

What never reaches the loss: episodes that ended ``infra_failed`` (or are still running) — they
are left out of the group statistics too, and counted (those excluded because a reward was
refused, :mod:`agentgym_lightning.reward_bounds`, also as ``episodes/reward_refused``); calls marked not trainable by the agent,
the env's ``agent_match`` or the trainer's (their tokens stay as context in a merged row,
masked); calls without token ids (an API backend); empty completions; with
``mask_truncated_completions``, completions cut by the token limit.

**Zero variance.** A group carries no learning signal when its episodes cannot be told apart:
their returns all tie, or the episode-level values ``mu`` and ``sigma`` are taken over all tie
(within 1e-9). With ``identical`` both say the same thing; with per-call values (``discounted``,
``final-only``, a plugin's) calls may differ while the episodes tie, and dividing those
differences by ``0 + 1e-4`` would blow them up 10,000-fold (advantages of ±500 from rewards of
±0.05). ``zero_variance_groups="skip"`` (default) drops such groups' rows (saving the compute);
``"keep"`` trains them with advantage 0, so they still dilute the token-normalised losses as TRL's
GRPOTrainer does. Groups left with fewer than
two usable episodes (the rest failed) cannot be compared and are skipped the same way.

``episode_weighting="equal"`` (default) gives each row the weight ``1 / rows of its episode``, so
an episode that made five calls counts as much as one that made one (Agent Lightning v1's
per-rollout normalisation); ``"per_call"`` weighs every row 1.

**An adapter per agent** (``lora_per_agent``, :mod:`.agent_adapters`). Each row names the adapter
it trains (``Sample.adapter``); calls of agents without one are not trained. With
``agent_advantages="per_agent"`` (the default there) step 2 runs once per agent: within the
task's group, the episodes in which that agent made calls each count once (the mean of *its*
calls' values) in that agent's ``mu`` and ``sigma``, and its calls are normalised by them; an
agent that ran in fewer than two of the group's episodes, or whose episodes tie, gets no signal
(its calls are skipped, or kept with advantage 0). A rewriter that runs only after a failed check
is so compared with the rewriter's other attempts, not with episodes that never needed it.
``"episode"`` keeps one normalisation per episode, every agent's calls sharing its advantage.

:func:`configured_samples` builds the rows as a :class:`~.config.LightningRLConfig` says (the
trainer's ``samples`` and the run viewer call it); the batch keeps each call's value and advantage
and each group's zero-variance flag, so what a page shows is what the update trained on.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentgym_lightning.agent_match import AgentMatchSpec, as_agent_match
from agentgym_lightning.credit import assign_credit
from agentgym_lightning.episode import untrainable_reason
from agentgym_lightning.llm import ids_extend
from agentgym_lightning.reward_bounds import reward_refused
from agentgym_lightning.training.agent_adapters import AgentAdapters
from agentgym_lightning.training.config import LightningRLConfig
from agentgym_lightning.training.shaping import outcome_first
from agentgym_lightning.trajectory import Status, Step, Trajectory

__all__ = [
    "Sample",
    "SampleBatch",
    "build_samples",
    "configured_samples",
    "untrained_reason",
    "ADVANTAGE_EPS",
]

#: Added to the group's std before dividing (TRL's value).
ADVANTAGE_EPS = 1e-4
_NAN = float("nan")
#: Values closer than this are the same (the zero-variance test).
_TIE = 1e-9


@dataclass
class Sample:
    """One training row: ``prompt_ids`` then ``completion_ids``, with per-completion-token data.

    In ``transition`` mode ``completion_ids`` is one call's completion; in ``trajectory`` mode it
    is everything after the first call's prompt (completions and the tokens between them).
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    #: 1 where the token was generated by the model in a trainable call, else 0.
    loss_mask: list[int]
    #: The generator's logprob of each completion token (NaN where the model did not generate it).
    sampling_logprobs: list[float]
    #: Advantage of each completion token (0 where masked).
    advantages: list[float]
    #: Weight of the row in the loss (see ``episode_weighting``).
    weight: float
    episode_id: str
    group_id: str | None
    #: Indices of the steps the row was made from.
    steps: list[int] = field(default_factory=list)
    #: The LoRA adapter the row trains (``lora_per_agent``); ``None``: the model's trainable weights.
    adapter: str | None = None
    #: Where the row's ids came from when not from the generator as recorded (SFT's re-tokenized
    #: teacher text: ``{"retokenized": True, "tokenizer": ..., "teacher_model": ...}``).
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.completion_ids)
        if not (len(self.loss_mask) == len(self.sampling_logprobs) == len(self.advantages) == n):
            raise ValueError(
                f"sample of episode {self.episode_id}: completion_ids ({n}), loss_mask ({len(self.loss_mask)}), "
                f"sampling_logprobs ({len(self.sampling_logprobs)}) and advantages ({len(self.advantages)}) must align"
            )

    @property
    def num_loss_tokens(self) -> int:
        return int(sum(self.loss_mask))


@dataclass
class SampleBatch:
    """The rows of one training step, and how they were made (counts for logging)."""

    samples: list[Sample] = field(default_factory=list)
    stats: dict[str, float] = field(default_factory=dict)
    #: Each call's value (step 1), by episode id: every episode that ended (not infra_failed).
    values: dict[str, list[float]] = field(default_factory=dict)
    #: Each call's advantage (step 2), by episode id: the episodes compared within their group.
    advantages: dict[str, list[float]] = field(default_factory=dict)
    #: Whether a group carried no learning signal, by group id (``episode:<id>`` for an episode
    #: without one): see "Zero variance".
    zero_variance: dict[str, bool] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.samples)


def _usable(step: Step) -> bool:
    c = step.completion
    return c is not None and c.prompt_token_ids is not None and c.completion_token_ids is not None


def _tie(xs: list[float]) -> bool:
    return max(xs) - min(xs) <= _TIE


def _zero_variance(flat_cells: Mapping[tuple[str, str | None], bool]) -> dict[str, bool]:
    """A group is zero-variance when every one of its (group, agent) cells is."""
    zero_variance: dict[str, bool] = {}
    for (key, _), flat in flat_cells.items():
        zero_variance[key] = zero_variance.get(key, True) and flat
    return zero_variance


def _advantages(
    trajectories: Sequence[Trajectory],
    credit: str,
    credit_kwargs: Mapping[str, Any] | None,
    scale_rewards: str,
    agent_of: Callable[[Step], str | None] | None,
) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[tuple[str, str | None], bool], dict[str, float]]:
    """Per-call values and advantages of trainable episodes (steps 1 and 2 of the module docstring),
    the zero-variance flag of every (group, agent) cell (one cell per group, agent ``None``,
    without ``agent_of``) and the counts. Episodes without advantages were excluded
    (infrastructure failures, unfinished, or alone in their group); ``agent_of`` (a step's agent,
    or ``None``) normalises each agent's calls on their own."""
    counts: dict[str, float] = defaultdict(float)
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        if not t.trainable:
            counts["episodes/infra_failed" if t.status is Status.INFRA_FAILED else "episodes/unfinished"] += 1
            if reward_refused(t):
                counts["episodes/reward_refused"] += 1
            continue
        groups[t.group_id if t.group_id is not None else f"episode:{t.episode_id}"].append(t)

    values: dict[str, list[float]] = {}
    #: episode id -> agent -> (indices of its calls, the mean of their values)
    cells: dict[str, dict[str | None, tuple[list[int], float]]] = {}
    for members in groups.values():
        for t in members:
            v = assign_credit(t, credit, **dict(credit_kwargs or {})) if t.steps else []
            values[t.episode_id] = v
            by_agent: dict[str | None, list[int]] = defaultdict(list)
            for i, step in enumerate(t.steps):
                by_agent[agent_of(step) if agent_of is not None else None].append(i)
            # An episode with no calls still tells the group what its return was.
            cells[t.episode_id] = {
                agent: (idx, float(sum(v[i] for i in idx) / len(idx))) for agent, idx in by_agent.items()
            } if v else {None: ([], t.total_reward)}

    def std(xs: list[float]) -> float:
        if len(xs) < 2:
            return _NAN
        m = sum(xs) / len(xs)
        return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))

    batch_sigma = std([mean for ms in groups.values() for t in ms for _, mean in cells[t.episode_id].values()])
    advantages: dict[str, list[float]] = {}
    flat_cells: dict[tuple[str, str | None], bool] = {}
    for key, members in groups.items():
        if len(members) < 2:
            counts["groups/too_small"] += 1
            counts["episodes/alone_in_group"] += len(members)
            continue
        counts["groups"] += 1
        returns_tie = _tie([t.total_reward for t in members])
        for t in members:
            advantages[t.episode_id] = [0.0] * len(values[t.episode_id])
        agents = list(dict.fromkeys(agent for t in members for agent in cells[t.episode_id]))
        for agent in agents:
            present = [t for t in members if agent in cells[t.episode_id]]
            episode_means = [cells[t.episode_id][agent][1] for t in present]
            flat = returns_tie or len(present) < 2 or _tie(episode_means)
            flat_cells[(key, agent)] = flat
            if flat:
                continue
            mu = sum(episode_means) / len(episode_means)
            if scale_rewards == "group":
                scale = std(episode_means) + ADVANTAGE_EPS
            elif scale_rewards == "batch":
                scale = batch_sigma + ADVANTAGE_EPS
            elif scale_rewards == "none":
                scale = 1.0
            else:
                raise ValueError(f"scale_rewards must be group, batch or none; got {scale_rewards!r}")
            for t in present:
                for i in cells[t.episode_id][agent][0]:
                    advantages[t.episode_id][i] = (values[t.episode_id][i] - mu) / scale
        if all(flat_cells[(key, agent)] for agent in agents):
            counts["groups/zero_variance"] += 1
        elif agent_of is not None:
            counts["agents/zero_variance"] += sum(flat_cells[(key, agent)] for agent in agents if agent is not None)
    return values, advantages, flat_cells, dict(counts)


def build_samples(
    trajectories: Sequence[Trajectory],
    *,
    aggregation: str = "transition",
    credit: str = "identical",
    credit_kwargs: Mapping[str, Any] | None = None,
    scale_rewards: str = "group",
    zero_variance_groups: str = "skip",
    episode_weighting: str = "equal",
    mask_truncated_completions: bool = False,
    agent_match: AgentMatchSpec | None = None,
    adapters: AgentAdapters | None = None,
    agent_advantages: str = "per_agent",
) -> SampleBatch:
    """Turn a step's finished episodes into training rows (see the module docstring).

    ``agent_match`` (see :mod:`agentgym_lightning.agent_match`) leaves the calls it does not match
    out of the loss, like calls the env marked not trainable; they still count in the advantages
    (the episode's return is the episode's, whoever made which call). ``adapters``
    (``lora_per_agent``): each row names its agent's adapter, the calls of agents without one are
    not trained, and ``agent_advantages`` says whether advantages are normalised ``per_agent`` or
    per ``episode``."""
    if aggregation not in ("transition", "trajectory"):
        raise ValueError(f"aggregation must be 'transition' or 'trajectory'; got {aggregation!r}")
    if zero_variance_groups not in ("skip", "keep"):
        raise ValueError(f"zero_variance_groups must be 'skip' or 'keep'; got {zero_variance_groups!r}")
    if episode_weighting not in ("equal", "per_call"):
        raise ValueError(f"episode_weighting must be 'equal' or 'per_call'; got {episode_weighting!r}")
    if agent_advantages not in ("per_agent", "episode"):
        raise ValueError(f"agent_advantages must be 'per_agent' or 'episode'; got {agent_advantages!r}")
    if adapters is not None and aggregation != "transition":
        raise ValueError("adapters (lora_per_agent) need aggregation 'transition': a trajectory row merges several agents' calls")
    agent_of = adapters.agent_of if adapters is not None and agent_advantages == "per_agent" else None
    values, advantages, flat_cells, counts = _advantages(trajectories, credit, credit_kwargs, scale_rewards, agent_of)
    match = _both(as_agent_match(agent_match), adapters.trains if adapters is not None else None)
    stats: dict[str, float] = defaultdict(float, counts)
    stats["episodes"] = float(len(trajectories))
    samples: list[Sample] = []
    for t in trajectories:
        if t.episode_id not in advantages:
            continue
        key = t.group_id if t.group_id is not None else f"episode:{t.episode_id}"
        skip = zero_variance_groups == "skip"
        if skip and all(flat for (group, _), flat in flat_cells.items() if group == key):
            stats["episodes/zero_variance_skipped"] += 1
            continue
        stats["episodes/trained"] += 1
        calls = []
        for step, adv in zip(t.steps, advantages[t.episode_id]):
            if step.completion is None:
                continue
            if skip and agent_of is not None and flat_cells.get((key, agent_of(step))) and (match is None or match(step)):
                stats["calls/zero_variance_skipped"] += 1  # this agent's episodes tie: nothing to learn for it
                continue
            if not _usable(step):
                stats["calls/without_token_ids"] += 1
                continue
            calls.append((step, adv))
        rows = _transition_rows(t, calls, mask_truncated_completions, match, stats) if aggregation == "transition" else _trajectory_rows(
            t, calls, mask_truncated_completions, match, stats
        )
        rows = [r for r in rows if r.num_loss_tokens > 0]
        if adapters is not None:
            by_index = {step.index: step for step in t.steps}
            for r in rows:
                r.adapter = adapters.adapter_of(by_index[r.steps[0]])
        if episode_weighting == "equal" and rows:
            for r in rows:
                r.weight = 1.0 / len(rows)
        samples.extend(rows)
    stats["rows"] = float(len(samples))
    stats["loss_tokens"] = float(sum(s.num_loss_tokens for s in samples))
    stats["tokens/total"] = float(sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples))
    return SampleBatch(
        samples=samples, stats=dict(stats), values=values, advantages=advantages, zero_variance=_zero_variance(flat_cells)
    )


def configured_samples(trajectories: Sequence[Trajectory], config: LightningRLConfig) -> SampleBatch:
    """:func:`build_samples` with ``config``'s options (``outcome_first``'s bounded shaping, credit,
    aggregation, advantages, ``agent_match``, ``lora_per_agent``'s adapters): the rows the trainer
    trains on."""
    return build_samples(
        outcome_first(trajectories) if config.outcome_first else trajectories,
        aggregation=config.aggregation,
        credit=config.credit,
        credit_kwargs=config.credit_kwargs,
        scale_rewards=config.scale_rewards,
        zero_variance_groups=config.zero_variance_groups,
        episode_weighting=config.episode_weighting,
        mask_truncated_completions=config.mask_truncated_completions,
        agent_match=config.agent_match,
        adapters=AgentAdapters.from_config(config),
        agent_advantages=config.agent_advantages,
    )


def _both(first: Callable[[Step], bool] | None, second: Callable[[Step], bool] | None) -> Callable[[Step], bool] | None:
    """A match requiring both (either may be ``None``: no condition)."""
    if first is None or second is None:
        return first or second
    return lambda step: first(step) and second(step)


def untrained_reason(step: Step, mask_truncated: bool = False, match: Callable[[Step], bool] | None = None) -> str | None:
    """Why a call's completion tokens stay out of the loss — ``"not_trainable"`` (its episode
    judged it so: the agent or the env's ``agent_match``), ``"agent_match_excluded"`` (``match``:
    both as :func:`~agentgym_lightning.episode.untrainable_reason` says), ``"without_token_ids"``,
    ``"empty"``, ``"truncated_masked"`` (the ``samples/calls/<reason>`` counts) — or ``None`` when
    they train."""
    reason = untrainable_reason(step, match)
    if reason is not None:
        return reason
    if step.completion is None or not _usable(step):
        return "without_token_ids"
    if not step.completion.completion_token_ids:
        return "empty"
    if mask_truncated and step.completion.finish_reason == "length":
        return "truncated_masked"
    return None


def _trainable_tokens(step: Step, mask_truncated: bool, match: Callable[[Step], bool] | None, stats: dict[str, float]) -> int:
    """1 if this call's completion tokens go into the loss, else 0 (and count why)."""
    reason = untrained_reason(step, mask_truncated, match)
    stats[f"calls/{reason or 'trained'}"] += 1
    if reason is None and step.request.repeated_user_turn:
        stats["calls/repeated_user_turn"] += 1  # trained on a prompt with the user's turn twice (a framework's doing)
    return 0 if reason else 1


def _logprobs_of(step: Step) -> list[float]:
    c = step.completion
    assert c is not None and c.completion_token_ids is not None
    if c.logprobs is None:
        return [_NAN] * len(c.completion_token_ids)
    return [float(x) for x in c.logprobs]


def _call_row(t: Trajectory, step: Step, adv: float, on: int) -> Sample:
    """One call of ``t`` as a row of its own: its prompt, then its completion, each completion
    token in the loss when ``on`` (1) with the call's advantage ``adv``."""
    c = step.completion
    assert c is not None and c.prompt_token_ids is not None and c.completion_token_ids is not None
    n = len(c.completion_token_ids)
    return Sample(
        prompt_ids=list(c.prompt_token_ids),
        completion_ids=list(c.completion_token_ids),
        loss_mask=[on] * n,
        sampling_logprobs=_logprobs_of(step),
        advantages=[adv * on] * n,
        weight=1.0,
        episode_id=t.episode_id,
        group_id=t.group_id,
        steps=[step.index],
    )


def _transition_rows(
    t: Trajectory,
    calls: list[tuple[Step, float]],
    mask_truncated: bool,
    match: Callable[[Step], bool] | None,
    stats: dict[str, float],
) -> list[Sample]:
    rows = []
    for step, adv in calls:
        rows.append(_call_row(t, step, adv, _trainable_tokens(step, mask_truncated, match, stats)))
    return rows


def _trajectory_rows(
    t: Trajectory,
    calls: list[tuple[Step, float]],
    mask_truncated: bool,
    match: Callable[[Step], bool] | None,
    stats: dict[str, float],
) -> list[Sample]:
    rows: list[Sample] = []
    current: Sample | None = None
    full: list[int] = []  # the current row's prompt + completion ids: what the next prompt must start with
    for step, adv in calls:
        c = step.completion
        assert c is not None and c.prompt_token_ids is not None and c.completion_token_ids is not None
        prompt = list(c.prompt_token_ids)
        on = _trainable_tokens(step, mask_truncated, match, stats)
        n = len(c.completion_token_ids)
        if current is not None and ids_extend(prompt, full):
            between = prompt[len(full) :]
            current.completion_ids += between + list(c.completion_token_ids)
            current.loss_mask += [0] * len(between) + [on] * n
            current.sampling_logprobs += [_NAN] * len(between) + _logprobs_of(step)
            current.advantages += [0.0] * len(between) + [adv * on] * n
            current.steps.append(step.index)
            stats["trajectory/merged_calls"] += 1
        else:
            if current is not None:
                stats["trajectory/fallbacks"] += 1  # the prompt did not extend the row: a new one starts
            current = _call_row(t, step, adv, on)
            rows.append(current)
        full = current.prompt_ids + current.completion_ids
    return rows
