"""The policy-gradient loss on padded rows: TRL's GRPO-family definitions, for multi-turn rows.

What is TRL's and reused as is: the per-token logprob and entropy computation
(``trl.trainer.utils.selective_log_softmax`` and ``entropy_from_logits``, on logits divided by
the sampling temperature), and the definitions of every supported ``loss_type`` — ``grpo``,
``dr_grpo``, ``dapo``, ``cispo`` — with token- or sequence-level ratios
(``importance_sampling_level``), two-sided clipping (``epsilon``, ``epsilon_high``, ``delta``),
the k3 KL estimator against a reference model (``beta``), and the truncated/masked importance-
sampling correction against the generator's logprobs (TRL's ``vllm_importance_sampling_*``).
``tests/training/test_loss.py`` checks this module against ``GRPOTrainer._compute_loss`` on the
same batch for every loss type.

What is ours, and why: TRL's ``GRPOTrainer`` takes one row per episode, with ``num_generations``
rows per group, and a per-row scalar advantage; LightningRL trains on a variable number of rows
per episode. So rows carry (a) per-token advantages (calls of one merged row may have different
values under ``discounted`` credit), and (b) a weight (``episode_weighting``). Every loss here is
a sum over micro-batches divided by a normaliser computed once for the whole step
(:func:`loss_normalizer`), so accumulating gradients over micro-batches gives exactly the loss of
one big batch. With weights 1 and one micro-batch, each equals TRL's.

Stale rollouts: the decoupled objective
---------------------------------------
Three policies meet in a step's loss:

* ``π_θ`` — the weights being trained: ``logps``, the only term with a gradient;
* ``π_prox`` — the *proximal* policy, the weights before this step's update: ``old_logps``,
  computed with the current weights at the start of the update (with ``num_iterations == 1``
  the trained forward itself, detached: ``π_θ`` and ``π_prox`` are then the same numbers);
* ``π_behav`` — the *behaviour* policy, what answered the call: the generator (another engine,
  dtype or kernel) at the weights it held then, whose logprobs every call carries
  (``Sample.sampling_logprobs``). Synchronous, that is the current version; with rollouts that
  run on while the weights update (``max_staleness`` k), up to k versions older.

Per loss token, with advantage ``A``::

    loss = - w · min(u · A, clip(u, 1 - epsilon_low, 1 + epsilon_high) · A)   (+ beta · KL)
    u    = π_θ / π_prox                    the PPO ratio: gradient, clipping, clip_ratio/*
    w    = trunc(π_prox / π_behav)         the behaviour weight: a constant (no gradient)

This is AReaL's decoupled PPO objective (Fu et al. 2025, "AReaL: A Large-Scale Asynchronous
Reinforcement Learning System for Language Reasoning", after Hilton et al. 2022's proximal policy).
Plain PPO clips ``π_θ / π_behav``: with stale behaviour that ratio starts far from 1, the trust
region is centred on weights k versions old, and tokens are clipped (their gradient dropped) for
their age, not for how far this update moves — AReaL measured plain PPO losing most of its
accuracy with stale rollouts, where the decoupled loss kept it. Decoupled, the trust region is around
``π_prox``, which the trainer computes now, and the sampling is corrected by ``w``. ``w`` is
unbounded where the behaviour policy gave a token a small probability that the proximal one no
longer does, so it is truncated (``sampling_correction_clip_max``, mode ``*_truncate``: Ionides'
truncated importance sampling, trading a bias for bounded variance) or such tokens are dropped
(``*_mask``: AReaL's ``behav_imp_weight_cap``); ``sampling_ratio/truncated`` says how often.

One weight corrects both causes. With ``v`` the version that answered and ``π_v`` the trained
model's policy at ``v``, ``π_prox / π_behav = (π_prox / π_v) · (π_v / π_behav)``: staleness times
the generator/trainer mismatch that TRL's ``vllm_importance_sampling_correction`` corrects. The
call carries ``π_behav`` only; the middle term would need a forward under weights ``v``, which
the trainer no longer holds, so the factors cannot be capped apart: ``w`` is their product,
computed from what the call carries and truncated once (:func:`_sampling_correction`). When the
call is current (``v`` is the weights being updated: every call at k = 0) the staleness factor
is 1 and ``w`` is TRL's correction as before; when the behaviour logprobs equal the current ones
(an ``hf`` generator sharing the model) ``w = 1`` and this is the on-policy loss
(``tests/training/test_decoupled_loss.py``). ``sampling_correction=False`` drops ``w``, and with
it the staleness correction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agentgym_lightning.training.loss_options import LossOptions
from agentgym_lightning.training.samples import Sample

__all__ = [
    "PaddedBatch", "pad_samples", "micro_batches", "per_token_logps", "loss_normalizer", "LossOptions", "policy_loss", "LossTerms",
    "sft_loss",
]


@dataclass
class PaddedBatch:
    """Rows as tensors: prompts left-padded, completions right-padded (TRL's layout)."""

    input_ids: torch.Tensor  # (B, P + C)
    attention_mask: torch.Tensor  # (B, P + C)
    completion_mask: torch.Tensor  # (B, C) float: 1 on tokens in the loss
    advantages: torch.Tensor  # (B, C)
    sampling_logps: torch.Tensor  # (B, C), NaN where unknown
    weights: torch.Tensor  # (B,)
    completion_width: int

    def to(self, device: torch.device | str) -> PaddedBatch:
        return PaddedBatch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.completion_mask.to(device),
            self.advantages.to(device),
            self.sampling_logps.to(device),
            self.weights.to(device),
            self.completion_width,
        )


def pad_samples(samples: Sequence[Sample], pad_token_id: int) -> PaddedBatch:
    """Stack rows: prompts padded on the left (so every completion starts at the same column)
    and completions on the right."""
    if not samples:
        raise ValueError("no samples to pad")
    p = max(len(s.prompt_ids) for s in samples)
    c = max(len(s.completion_ids) for s in samples)
    b = len(samples)
    input_ids = torch.full((b, p + c), pad_token_id, dtype=torch.long)
    attention = torch.zeros((b, p + c), dtype=torch.long)
    mask = torch.zeros((b, c), dtype=torch.float32)
    adv = torch.zeros((b, c), dtype=torch.float32)
    slp = torch.full((b, c), float("nan"), dtype=torch.float32)
    for i, s in enumerate(samples):
        lp, lc = len(s.prompt_ids), len(s.completion_ids)
        input_ids[i, p - lp : p] = torch.tensor(s.prompt_ids, dtype=torch.long)
        input_ids[i, p : p + lc] = torch.tensor(s.completion_ids, dtype=torch.long)
        attention[i, p - lp : p + lc] = 1
        mask[i, :lc] = torch.tensor(s.loss_mask, dtype=torch.float32)
        adv[i, :lc] = torch.tensor(s.advantages, dtype=torch.float32)
        slp[i, :lc] = torch.tensor(s.sampling_logprobs, dtype=torch.float32)
    weights = torch.tensor([s.weight for s in samples], dtype=torch.float32)
    return PaddedBatch(input_ids, attention, mask, adv, slp, weights, c)


def micro_batches(samples: Sequence[Sample], max_rows: int, max_tokens: int | None = None) -> list[list[Sample]]:
    """Split ``samples`` (in order) into micro-batches of at most ``max_rows`` rows whose padded
    size, rows times the longest prompt plus the longest completion, stays within ``max_tokens``
    (``None``: no token limit). A row longer than ``max_tokens`` is a micro-batch of its own.

    Rows are cut by tokens because a forward/backward's memory grows with the padded tokens (and
    faster, with attention): two 1,500-token rows of SmolLM2-135M take 6.4 GB on CPU, and eight
    rows that long (late calls of multi-call episodes) ran a 24 GB machine out of memory. Sort
    ``samples`` by length first so that long rows are not padded with short ones."""
    if max_rows < 1:
        raise ValueError(f"max_rows must be at least 1, got {max_rows}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1 or None, got {max_tokens}")
    batches: list[list[Sample]] = []
    current: list[Sample] = []
    prompt = completion = 0
    for sample in samples:
        p, c = max(prompt, len(sample.prompt_ids)), max(completion, len(sample.completion_ids))
        full = len(current) >= max_rows or (max_tokens is not None and (len(current) + 1) * (p + c) > max_tokens)
        if current and full:
            batches.append(current)
            current, p, c = [], len(sample.prompt_ids), len(sample.completion_ids)
        current.append(sample)
        prompt, completion = p, c
    if current:
        batches.append(current)
    return batches


def per_token_logps(
    model: Any, batch: PaddedBatch, temperature: float, *, compute_entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob (and entropy) of every completion token under ``model`` at ``temperature``: one
    forward pass, logits kept only for the completion columns (TRL's computation)."""
    from trl.trainer.utils import entropy_from_logits, selective_log_softmax

    width = batch.completion_width
    # Position ids from the attention mask, so left padding does not shift positions.
    position_ids = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=position_ids,
        logits_to_keep=width + 1,
        use_cache=False,
    ).logits
    logits = logits[:, :-1, :].float()  # position t predicts token t+1
    logits = logits / temperature
    targets = batch.input_ids[:, -width:]
    logps = selective_log_softmax(logits, targets)
    entropy = None
    if compute_entropy:
        with torch.no_grad():
            entropy = entropy_from_logits(logits)
    return logps, entropy


def loss_normalizer(samples: Sequence[Sample], loss_type: str, max_completion_length: int | None = None) -> float:
    """The denominator of the step's loss, over all its rows (so micro-batching is exact):

    * ``grpo`` — the sum of row weights (each row contributes its weighted per-token mean);
    * ``dapo``, ``cispo`` — the weighted count of loss tokens (TRL's ``bnpo``, normalised per
      micro-batch, is not offered: with a step-wide normaliser it would be ``dapo``);
    * ``dr_grpo`` — the sum of row weights times ``max_completion_length``.
    """
    if loss_type == "grpo":
        return float(sum(s.weight for s in samples))
    if loss_type in ("dapo", "cispo"):
        return float(sum(s.weight * s.num_loss_tokens for s in samples))
    if loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("dr_grpo needs max_completion_length")
        return float(sum(s.weight for s in samples) * max_completion_length)
    raise ValueError(f"unknown loss_type {loss_type!r}")


@dataclass
class LossTerms:
    """The loss of one micro-batch (already divided by the step's normaliser) and its statistics
    (sums over its loss tokens, to be added up across micro-batches)."""

    loss: torch.Tensor
    tokens: float
    kl_sum: float
    entropy_sum: float
    clipped_low: float
    clipped_high: float
    ratio_sum: float
    sampling_ratio_sum: float
    #: Loss tokens whose behaviour weight was truncated or masked (``sampling_correction_clip_*``).
    sampling_truncated: float = 0.0


def policy_loss(
    logps: torch.Tensor,
    batch: PaddedBatch,
    options: LossOptions,
    *,
    normalizer: float,
    old_logps: torch.Tensor | None = None,
    ref_logps: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> LossTerms:
    """TRL's GRPO-family loss (see the module docstring) for one micro-batch, as ``options`` define it:
    the decoupled objective, clipped against the proximal policy and weighted by the truncated
    behaviour weight against ``batch.sampling_logps``.

    ``old_logps`` are the proximal policy's: the logprobs before this step's first update
    (``None``: the current ones, detached — one optimizer pass per step, so the ratio is 1);
    ``ref_logps`` those of the reference model (needed when ``beta > 0``).
    """
    loss_type, beta, epsilon_low, epsilon_high = options.loss_type, options.beta, options.epsilon_low, options.epsilon_high
    mask = batch.completion_mask
    advantages = batch.advantages
    old = logps.detach() if old_logps is None else old_logps

    log_ratio = logps - old
    if options.importance_sampling_level == "token":
        log_w = log_ratio
    elif options.importance_sampling_level == "sequence":
        log_w = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    else:
        raise ValueError(f"importance_sampling_level must be token or sequence; got {options.importance_sampling_level!r}")
    ratio = torch.exp(log_w)
    coef_1 = ratio

    if loss_type == "cispo":
        clamped = torch.clamp(coef_1, max=epsilon_high).detach()
        per_token = -clamped * advantages * logps
    elif loss_type in ("grpo", "dr_grpo", "dapo"):
        coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
        if options.delta is not None:
            coef_1 = torch.clamp(coef_1, max=options.delta)
        per_token = -torch.min(coef_1 * advantages, coef_2 * advantages)
    else:
        raise ValueError(f"unknown loss_type {loss_type!r}")

    sampling_ratio = truncated = None
    if options.sampling_correction:  # the behaviour weight, π_prox / π_behav truncated (module docstring)
        sampling_ratio, truncated = _sampling_correction(
            old, batch.sampling_logps, mask, options.sampling_correction_mode, options.sampling_correction_clip_min,
            options.sampling_correction_clip_max,
        )
        per_token = per_token * sampling_ratio

    kl = None
    if beta != 0.0:
        if ref_logps is None:
            raise ValueError("beta > 0 needs the reference model's logprobs")
        kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
        if options.use_bias_correction_kl:  # TRL's default: the unbiased reverse-KL gradient (DeepSeek-V3.2)
            kl = kl * ratio  # before any delta clamp, as TRL
        per_token = per_token + beta * kl

    w = batch.weights.unsqueeze(-1)
    if loss_type == "grpo":
        row_mean = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        loss = (batch.weights * row_mean).sum() / normalizer
    else:  # token sums; the normaliser says what they are divided by
        loss = (per_token * mask * w).sum() / normalizer

    with torch.no_grad():
        tokens = float(mask.sum())
        low = ((ratio < 1 - epsilon_low) & (advantages < 0)).float() if loss_type != "cispo" else torch.zeros_like(mask)
        high = ((ratio > 1 + epsilon_high) & (advantages > 0)).float()
        if low.shape != mask.shape:
            low = low.expand_as(mask)
            high = high.expand_as(mask)
        return LossTerms(
            loss=loss,
            tokens=tokens,
            kl_sum=float((kl * mask).sum()) if kl is not None else 0.0,
            entropy_sum=float((entropy * mask).sum()) if entropy is not None else 0.0,
            clipped_low=float((low * mask).sum()),
            clipped_high=float((high * mask).sum()),
            ratio_sum=float((ratio.expand_as(mask) * mask).sum()),
            sampling_ratio_sum=float((sampling_ratio.expand_as(mask) * mask).sum()) if sampling_ratio is not None else tokens,
            sampling_truncated=float((truncated.expand_as(mask) * mask).sum()) if truncated is not None else 0.0,
        )


def sft_loss(logps: torch.Tensor, batch: PaddedBatch, *, normalizer: float, entropy: torch.Tensor | None = None) -> LossTerms:
    """Supervised fine-tuning's loss for one micro-batch: the negative log-likelihood of the
    completion tokens in the loss (``completion_mask``), each row weighted, summed and divided by
    the step's ``normalizer`` (:func:`loss_normalizer` with ``"dapo"``: the weighted count of loss
    tokens, so micro-batching gives the token mean of the whole step). Advantages and sampling
    logprobs are not read; the ratio statistics are those of an on-policy step (ratio 1)."""
    mask = batch.completion_mask
    loss = (-logps * mask * batch.weights.unsqueeze(-1)).sum() / normalizer
    with torch.no_grad():
        tokens = float(mask.sum())
        return LossTerms(
            loss=loss,
            tokens=tokens,
            kl_sum=0.0,
            entropy_sum=float((entropy * mask).sum()) if entropy is not None else 0.0,
            clipped_low=0.0,
            clipped_high=0.0,
            ratio_sum=tokens,
            sampling_ratio_sum=tokens,
        )


def _sampling_correction(
    old: torch.Tensor,
    sampling: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    clip_min: float | None,
    clip_max: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The behaviour weight ``exp(old - sampling)`` (proximal over behaviour policy: the
    generator's mismatch and its staleness, one weight; see the module docstring), per token or
    per sequence, truncated or masked as TRL's importance-sampling correction is; and where the
    bounds changed it (1.0, else 0.0). Tokens with no sampling logprob (NaN) get weight 1."""
    diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)
    ratio = raw = torch.exp(diff)
    if mode.endswith("truncate"):
        ratio = torch.clamp(ratio, min=clip_min, max=clip_max)
    elif mode.endswith("mask"):
        low = clip_min if clip_min is not None else float("-inf")
        high = clip_max if clip_max is not None else float("inf")
        ratio = ratio.masked_fill((ratio < low) | (ratio > high), 0.0)
    else:
        raise ValueError(f"unknown sampling correction mode {mode!r}")
    return ratio.detach(), (ratio != raw).float().detach()
