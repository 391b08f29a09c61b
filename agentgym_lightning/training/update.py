"""The update's pieces: a step's rows as micro-batches, their logprobs, their loss and its statistics.

The trainer's :meth:`~agentgym_lightning.training.trainer.LightningRLTrainer.update` is the
optimizer loop (zero the gradients, backward each micro-batch's loss, clip, step); this module is
what it runs on:

* :class:`MicroBatches` — the step's rows cut to fit ``micro_batch_tokens``: each run as one token
  tree (:mod:`.token_tree`: shared prefixes once, the same loss and gradients) or, with
  ``packed_update=False`` or a model that cannot take the tree's mask (:func:`packed_update`), as
  padded rows (at most ``per_device_train_batch_size`` of them). With ``lora_per_agent`` each
  adapter's rows are micro-batched apart, run with that adapter active and normalised over its own
  rows, so an agent's gradient never depends on how many rows another agent had. It gives the
  logprobs of the proximal policy and of the KL reference (:meth:`MicroBatches.fixed_logps`) and
  each micro-batch's loss (:meth:`MicroBatches.loss`: :func:`~.loss.policy_loss` with the config's
  :class:`~.loss_options.LossOptions`). The proximal policy is always the weights this update starts from,
  whatever version generated the rows: each micro-batch's own forward (``num_iterations == 1``,
  with its adapter active) or one pass before the first optimizer step; the behaviour weight
  against the rows' generator logprobs is taken against it (:mod:`.loss`'s docstring).
* :class:`UpdateStats` — the loss's statistics summed over micro-batches and iterations, the
  non-finite guard (:class:`NonFiniteUpdateWarning`) and the metrics the step logs.
* :func:`optimize` — the optimizer loop over the micro-batches (the RL and SFT trainers' both).
* :func:`clip_gradients` — one norm over the trained weights, or each adapter clipped on its own.
* :func:`warn_if_prefixes_repeated` — :class:`MicroBatchesRepeatPrefixesWarning`, once per run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from agentgym_lightning.memory import release_freed_memory
from agentgym_lightning.training.agent_adapters import AgentAdapters, activate
from agentgym_lightning.training.loss import (
    LossTerms,
    PaddedBatch,
    loss_normalizer,
    micro_batches,
    pad_samples,
    per_token_logps,
    policy_loss,
    sft_loss,
)
from agentgym_lightning.training.models import AdapterReference
from agentgym_lightning.training.run_config import RunConfig
from agentgym_lightning.training.samples import Sample
from agentgym_lightning.training.token_tree import (
    TokenTree,
    build_token_tree,
    count_unique_tokens,
    packed_unsupported_reason,
    tree_micro_batches,
    tree_token_logps,
)

__all__ = [
    "FixedLogps", "MicroBatches", "MicroBatchesRepeatPrefixesWarning", "NonFiniteUpdateWarning", "UpdateStats", "clip_gradients",
    "optimize", "packed_update", "warn_if_prefixes_repeated",
]


class NonFiniteUpdateWarning(RuntimeWarning):
    """An update's loss or gradients were not finite: it was skipped, the weights are unchanged."""


class MicroBatchesRepeatPrefixesWarning(UserWarning):
    """``micro_batch_tokens`` cut the step's token tree where rows share long prefixes (a prompt
    longer than the budget's share of it, such as Spider's schemas): each micro-batch ran the
    shared prefix again. The loss is unchanged; only compute is lost."""


#: Token positions the tree update may run per unique token before it warns (issue 18's bar).
_PREFIX_REPEAT_WARN_RATIO = 1.25


def packed_update(model: Any, option: bool | str) -> bool:
    """Whether the update runs token trees (``packed_update``): ``auto`` falls back to padded rows,
    saying why once, for a model whose attention cannot take the tree's mask; ``True`` insists."""
    if option is False:
        return False
    reason = packed_unsupported_reason(model)
    if reason is None:
        return True
    if option is True:
        raise ValueError(f"packed_update=True, but the model cannot run the token-tree update: {reason}; set packed_update to 'auto' or False")
    warnings.warn(
        f"the update runs padded rows, not token trees (shared prefixes are computed once per row): {reason}. "
        "Load the model with attn_implementation='sdpa' to share them, or set packed_update=False to silence this.",
        stacklevel=3,  # the caller of LightningRLTrainer(...)
    )
    return False


@contextlib.contextmanager
def _reference(model: Any, ref_model: Any) -> Iterator[Any]:
    if isinstance(ref_model, AdapterReference):  # LoRA from adapters: the adapters' initial weights
        with ref_model.swapped_in() as reference:
            yield reference
    elif ref_model is model:  # LoRA: the base model is the reference
        with model.disable_adapter():
            yield model
    else:
        yield ref_model


@dataclass
class FixedLogps:
    """Per micro-batch, the logprobs that do not move during the step: the proximal policy's (the
    weights before its first iteration; needed when ``num_iterations > 1``, else the trained
    forward is that policy) and the KL reference's (``beta > 0``)."""

    old: list[torch.Tensor] | None = None
    ref: list[torch.Tensor] | None = None


#: ``share(rows, cut) -> (micro-batches, padding)``: this rank's micro-batches of a part's
#: ``rows`` (``cut`` makes micro-batches of rows) and how many at the end only pad
#: (:meth:`~agentgym_lightning.training.ranks.Ranks.share`).
RowShare = Callable[[Sequence[Sample], Callable[[list[Sample]], list[list[Sample]]]], tuple[list[list[Sample]], int]]


class MicroBatches:
    """A step's rows as micro-batches on ``device``: token trees when ``packed``, else padded rows.

    ``parts`` are the rows of each adapter (``lora_per_agent``) or, without adapters, one part of
    every row; each part is micro-batched apart (trees never mix adapters) and normalised on its
    own rows. ``owners[i]`` is micro-batch ``i``'s adapter (``None``: the model's trained weights).
    ``share`` (N ranks): each part's rows this rank runs, its normaliser still over all of them."""

    def __init__(
        self,
        samples: Sequence[Sample],
        config: RunConfig,
        *,
        packed: bool,
        pad_token_id: int,
        device: torch.device | str,
        adapters: AgentAdapters | None = None,
        share: RowShare | None = None,
    ) -> None:
        self.config = config
        self.loss_options = config.loss_options
        self.adapters = adapters
        self.samples = list(samples)
        self.parts: dict[str | None, list[Sample]] = defaultdict(list)
        for row in self.samples:
            self.parts[row.adapter if adapters is not None else None].append(row)
        groups: list[list[Sample]] = []
        self.owners: list[str | None] = []
        self.normalizers: list[float] = []
        #: Micro-batches run only so that every rank runs as many (N ranks): their loss counts zero.
        self.padding: list[bool] = []

        def cut(rows: list[Sample]) -> list[list[Sample]]:
            if packed:
                return tree_micro_batches(rows, config.micro_batch_tokens)
            rows = sorted(rows, key=lambda s: len(s.prompt_ids) + len(s.completion_ids))
            return micro_batches(rows, config.per_device_train_batch_size, config.micro_batch_tokens)

        for owner, rows in self.parts.items():
            owned, padding = share(rows, cut) if share is not None else (cut(rows), 0)
            groups += owned
            self.owners += [owner] * len(owned)
            self.padding += [False] * (len(owned) - padding) + [True] * padding
            # the part's normaliser over every rank's rows: N ranks' summed gradients are one rank's
            self.normalizers += [loss_normalizer(rows, self.loss_options.loss_type, config.max_completion_length)] * len(owned)
        self.trees: list[TokenTree] | None = [build_token_tree(rows).to(device) for rows in groups] if packed else None
        self.padded: list[PaddedBatch] = [pad_samples(rows, pad_token_id).to(device) for rows in groups]

    def __len__(self) -> int:
        return len(self.padded)

    def token_logps(self, model: Any, i: int, compute_entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Micro-batch ``i``'s completion logprobs (and entropy) under ``model``, its adapter active."""
        if self.adapters is not None and self.owners[i] is not None:
            # On the model given: adapters are LoRA, so the KL reference is this same model, adapters off.
            activate(model, self.owners[i], self.adapters.names)
        if self.trees is not None:
            return tree_token_logps(model, self.trees[i], self.padded[i], self.config.logprob_temperature, compute_entropy=compute_entropy)
        return per_token_logps(model, self.padded[i], self.config.logprob_temperature, compute_entropy=compute_entropy)

    def fixed_logps(self, model: Any, ref_model: Any | None) -> FixedLogps:
        """The proximal policy's logprobs, under ``model``'s current weights (``num_iterations > 1``),
        and the reference's (``ref_model``), no gradients. Call it before the first optimizer step."""
        fixed = FixedLogps()
        with torch.no_grad():
            if self.config.update_iterations > 1:
                fixed.old = [self.token_logps(model, i, compute_entropy=False)[0] for i in range(len(self))]
            if ref_model is not None:
                with _reference(model, ref_model) as reference:
                    fixed.ref = [self.token_logps(reference, i, compute_entropy=False)[0] for i in range(len(self))]
        return fixed

    def loss(self, model: Any, i: int, fixed: FixedLogps) -> LossTerms:
        """Micro-batch ``i``'s loss under ``model`` (already divided by its part's normaliser)."""
        logps, entropy = self.token_logps(model, i)
        terms = policy_loss(
            logps,
            self.padded[i],
            self.loss_options,
            normalizer=self.normalizers[i],
            old_logps=fixed.old[i] if fixed.old is not None else None,
            ref_logps=fixed.ref[i] if fixed.ref is not None else None,
            entropy=entropy,
        )
        if self.padding[i]:  # the same forward and backward as a real one, nothing counted
            zero = {name: 0.0 for name in UpdateStats._SUMS}
            return dataclasses.replace(terms, loss=terms.loss * 0.0, **zero)
        return terms

    def sft_loss(self, model: Any, i: int) -> LossTerms:
        """Micro-batch ``i``'s supervised loss under ``model`` (:func:`~.loss.sft_loss`: the
        negative log-likelihood of its loss tokens at temperature 1, over the step's weighted loss
        tokens); the SFT trainer's, its config's ``loss_options`` a token-sum normaliser (``dapo``'s)."""
        logps, entropy = self.token_logps(model, i)
        return sft_loss(logps, self.padded[i], normalizer=self.normalizers[i], entropy=entropy)

    @property
    def forward_tokens(self) -> int:
        """Token positions one trained forward runs (the old/reference passes run them again)."""
        return sum(t.num_nodes for t in self.trees) if self.trees is not None else sum(m.input_ids.numel() for m in self.padded)

    @property
    def shareable_tokens(self) -> int:
        """The unique tokens micro-batching could have shared: adapters' rows run apart (never one tree)."""
        if len(self.parts) == 1:
            return count_unique_tokens(self.samples)
        return sum(count_unique_tokens(rows) for rows in self.parts.values())


def clip_gradients(model: Any, adapter_params: dict[str, list[Any]], max_grad_norm: float) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip the gradients to ``max_grad_norm`` (``<= 0``: no clipping); returns the norm before
    clipping and, with adapters, each adapter's.

    Each adapter is its agent's policy: clipped on its own, so one agent's large gradient never
    shrinks another's step (the returned norm is theirs combined)."""
    max_norm = max_grad_norm if max_grad_norm > 0 else float("inf")
    if adapter_params:
        norms = {name: float(torch.nn.utils.clip_grad_norm_(ps, max_norm)) for name, ps in adapter_params.items()}
        return torch.tensor(math.sqrt(sum(n * n for n in norms.values()))), norms
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.nn.utils.clip_grad_norm_(params, max_norm), {}


@dataclass
class UpdateStats:
    """The loss's statistics, summed over a step's micro-batches and iterations (per adapter too)."""

    adapters: Sequence[str] = ()
    totals: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    _SUMS = ("tokens", "kl_sum", "entropy_sum", "clipped_low", "clipped_high", "ratio_sum", "sampling_ratio_sum", "sampling_truncated")

    def add(self, terms: LossTerms, owner: str | None) -> None:
        """Count one micro-batch's loss terms (``owner``: its adapter)."""
        totals = self.totals
        totals["loss"] += float(terms.loss.detach())
        for name in self._SUMS:
            totals[name] += getattr(terms, name)
        if owner is not None:
            totals[f"{owner}/loss"] += float(terms.loss.detach())
            for name in ("tokens", "kl_sum", "entropy_sum"):
                totals[f"{owner}/{name}"] += getattr(terms, name)

    def finite(self, grad_norm: torch.Tensor) -> bool:
        """Whether the loss so far and this iteration's gradient norm are finite."""
        return math.isfinite(float(grad_norm)) and math.isfinite(self.totals["loss"])

    def skip_nonfinite(self, step: int, grad_norm: torch.Tensor) -> None:
        """Count an iteration skipped for its non-finite loss or gradients, and warn."""
        self.totals["nonfinite_skipped"] += 1
        warnings.warn(
            f"step {step}: the update's loss ({self.totals['loss']}) or gradient norm ({float(grad_norm)}) "
            "is not finite; it was skipped and the weights are unchanged (update/nonfinite_skipped)",
            NonFiniteUpdateWarning,
            stacklevel=4,  # the caller of the trainer's update (through optimize)
        )

    def add_grad_norms(self, grad_norm: torch.Tensor, norms: dict[str, float]) -> None:
        """Count an applied iteration's gradient norm (and each adapter's)."""
        self.totals["grad_norm"] += float(grad_norm)
        for name, norm in norms.items():
            self.totals[f"{name}/grad_norm"] += norm

    def metrics(self, micro: MicroBatches, learning_rate: float) -> dict[str, float]:
        """The step's update metrics (docs/metrics.md): means over iterations and loss tokens."""
        totals, n = self.totals, micro.config.update_iterations
        tokens = max(totals["tokens"], 1.0)
        per_adapter: dict[str, float] = {}
        for name in self.adapters:
            owned = max(totals[f"{name}/tokens"], 1.0)
            per_adapter.update({
                f"adapters/{name}/rows": float(sum(1 for row in micro.samples if row.adapter == name)),
                f"adapters/{name}/loss": totals[f"{name}/loss"] / n,
                f"adapters/{name}/grad_norm": totals[f"{name}/grad_norm"] / n,
                f"adapters/{name}/kl": totals[f"{name}/kl_sum"] / owned,
                f"adapters/{name}/entropy": totals[f"{name}/entropy_sum"] / owned,
            })
        return {
            **per_adapter,
            "loss": totals["loss"] / n,
            "grad_norm": totals["grad_norm"] / n,
            "kl": totals["kl_sum"] / tokens,
            "entropy": totals["entropy_sum"] / tokens,
            "clip_ratio/low": totals["clipped_low"] / tokens,
            "clip_ratio/high": totals["clipped_high"] / tokens,
            "clip_ratio/region": (totals["clipped_low"] + totals["clipped_high"]) / tokens,
            "ratio/mean": totals["ratio_sum"] / tokens,
            "sampling_ratio/mean": totals["sampling_ratio_sum"] / tokens,
            "sampling_ratio/truncated": totals["sampling_truncated"] / tokens,
            "learning_rate": learning_rate,
            "update/nonfinite_skipped": totals["nonfinite_skipped"],
            # The trained forward of one iteration (the old/reference passes run the same positions again).
            "update/tokens/forward": float(micro.forward_tokens),
            "update/tokens/unique": float(count_unique_tokens(micro.samples)),
            "update/packed": float(micro.trees is not None),
        }


def optimize(
    micro: MicroBatches,
    loss_of: Callable[[int], LossTerms],
    *,
    model: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    adapter_params: dict[str, list[Any]],
    max_grad_norm: float,
    iterations: int = 1,
    step: int,
) -> UpdateStats:
    """The optimizer loop over ``micro``'s micro-batches, ``iterations`` times: zero the gradients,
    backward each micro-batch's ``loss_of(i)``, clip (:func:`clip_gradients`), step the optimizer
    and the scheduler, and free the gradients. An iteration whose loss or gradient norm is not
    finite is never applied (counted and warned: :class:`NonFiniteUpdateWarning`, naming ``step``).
    The model trains in between and is left in eval mode, its first adapter active. The RL
    trainer's update (the policy loss) and the SFT trainer's (the supervised loss) both run it."""
    stats = UpdateStats(adapters=tuple(adapter_params))
    model.train()
    try:
        for _ in range(iterations):
            optimizer.zero_grad(set_to_none=True)
            for i in range(len(micro)):
                terms = loss_of(i)
                terms.loss.backward()
                stats.add(terms, micro.owners[i])
                if i + 1 < len(micro):
                    # Give back what this micro-batch freed before the next one allocates its own,
                    # of other sizes, which glibc would not fit into it (Spider SFT, 2 micro-batches
                    # of ~3,700 nodes: peak RSS 7.25 -> 5.11 GiB; docs/training.md).
                    release_freed_memory()
            grad_norm, adapter_norms = clip_gradients(model, adapter_params, max_grad_norm)
            if not stats.finite(grad_norm):
                # A NaN/inf step would ruin the weights for good: never apply it (counted, warned).
                optimizer.zero_grad(set_to_none=True)
                stats.skip_nonfinite(step, grad_norm)
                continue
            stats.add_grad_norms(grad_norm, adapter_norms)
            optimizer.step()
            scheduler.step()
            # Nothing reads the gradients again: freed now, they don't sit through the next
            # rollouts and evals (a full fine-tune's gradients are as big as its weights).
            optimizer.zero_grad(set_to_none=True)
    finally:
        model.eval()
        if micro.adapters is not None:
            activate(model, micro.adapters.names[0], micro.adapters.names)
    return stats


def warn_if_prefixes_repeated(micro: MicroBatches, step: int) -> bool:
    """Warn (:class:`MicroBatchesRepeatPrefixesWarning`) when the tree update ran shared prefixes
    more than once (``micro_batch_tokens`` cut a group's tree); returns whether it warned. The
    trainer calls it until it has warned once."""
    if micro.trees is None:
        return False
    forward, shareable = micro.forward_tokens, micro.shareable_tokens
    if forward <= _PREFIX_REPEAT_WARN_RATIO * shareable:
        return False
    warnings.warn(
        f"step {step}: micro_batch_tokens={micro.config.micro_batch_tokens} cut the token tree into {len(micro.trees)} "
        f"micro-batches that repeat shared prefixes: the update ran {forward} token positions for {shareable} unique "
        f"ones ({forward / shareable:.2f}x). A micro_batch_tokens that holds a task's group (this step's whole tree: "
        f"{shareable}) runs each prefix once, for the memory that costs (a tree of n tokens holds n x n attention "
        "scores per head); the loss is the same either way. Warned once per run (update/tokens/forward).",
        MicroBatchesRepeatPrefixesWarning,
        stacklevel=3,  # the caller of LightningRLTrainer.update
    )
    return True
