"""The prefix-shared update: a micro-batch's rows as one token tree, run through the model once.

A step's rows share most of their tokens: the ``G`` episodes of a task share the system prompt and
the question, an episode's later calls extend its earlier ones, and a converged model repeats
whole rows. Padded row-by-row (:func:`~agentgym_lightning.training.loss.pad_samples`), the update
runs every shared token once per row that holds it. Here the rows become a trie (a node per
distinct token path from the start of a row), and the trie's nodes run as ONE packed sequence: a
4D attention mask lets each node see only its ancestors and ``position_ids`` are the nodes' depths,
so every node computes exactly what it computes at that position of any row that holds it.

Each row's completion logprob at column ``j`` is the logprob of its node at depth ``P + j`` under
the logits of that node's parent, so logits are computed only for the parents of the rows' loss
tokens (the vocabulary makes logits the biggest tensor), and the per-node values are *gathered*
back into the padded ``(rows, completion)`` layout of :class:`~.loss.PaddedBatch`. The loss
(:func:`~.loss.policy_loss`, unchanged), its gradients (they flow back through the gather) and
every statistic are therefore those of the row-by-row computation, for every loss type, importance
sampling level, aggregation mode, KL and ``num_iterations``; two identical rows simply share nodes.

What it needs from the model: a decoder-only causal LM whose attention takes a custom 4D mask —
``sdpa`` or ``eager``; both get one additive float mask in the weights' dtype. Flash-attention
kernels do not take such masks: :func:`packed_unsupported_reason` says why a model cannot be
served, and the trainer falls back to the padded update (``packed_update`` in the config).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from agentgym_lightning.llm import common_prefix_length
from agentgym_lightning.training.loss import PaddedBatch
from agentgym_lightning.training.samples import Sample

__all__ = ["TokenTree", "build_token_tree", "tree_micro_batches", "tree_token_logps", "packed_unsupported_reason", "count_unique_tokens", "plain_lm_head"]

#: Attention implementations that take an arbitrary 4D mask. Both get an additive float mask: given
#: a boolean one, sdpa converts it to float in every layer and keeps each copy for the backward
#: (n x n x 4 bytes a layer; SmolLM2-135M at 4,096 nodes, bench/bench_activations.py: 7.3 GiB
#: kept for the backward against 5.5 GiB with one float mask, the same loss to the last digit).
_TAKES_4D_MASK = ("sdpa", "eager")


@dataclass
class TokenTree:
    """A micro-batch's rows as one packed sequence of trie nodes (batch of 1, no padding).

    ``node_ids[k]`` is node ``k``'s token, ``parents[k]`` its parent (-1 at a row's first token),
    ``depths[k]`` its position in every row that holds it. ``logit_nodes`` are the nodes whose
    logits are needed (the parents of loss tokens), ``scored_nodes[s]`` the node whose logprob is
    slot ``s`` (its parent is ``logit_nodes[logit_slot[s]]``), and ``gather[i, j]`` the slot of row
    ``i``'s completion column ``j`` (``len(scored_nodes)``, a constant 0, where it is not in the loss).
    """

    node_ids: torch.Tensor  # (n,) long
    parents: torch.Tensor  # (n,) long
    depths: torch.Tensor  # (n,) long
    logit_nodes: torch.Tensor  # (m,) long, sorted
    scored_nodes: torch.Tensor  # (s,) long
    logit_slot: torch.Tensor  # (s,) long: index into logit_nodes
    gather: torch.Tensor  # (rows, completion width) long

    @property
    def num_nodes(self) -> int:
        return int(self.node_ids.numel())

    def to(self, device: torch.device | str) -> TokenTree:
        return TokenTree(*(t.to(device) for t in (self.node_ids, self.parents, self.depths, self.logit_nodes, self.scored_nodes, self.logit_slot, self.gather)))

    def attention_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """The ``(1, 1, n, n)`` additive mask in which each node sees itself and its ancestors
        only: 0 where it attends, else the ``dtype``'s minimum."""
        n = self.num_nodes
        parents = self.parents.cpu().numpy()
        sees = np.zeros((n, n), dtype=bool)
        for k in range(n):  # a parent always precedes its children (insertion order)
            if parents[k] >= 0:
                sees[k] = sees[parents[k]]
            sees[k, k] = True
        mask = torch.from_numpy(sees).to(self.node_ids.device)
        additive = torch.zeros((n, n), dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)
        return additive[None, None]


def _row(sample: Sample) -> list[int]:
    return [*sample.prompt_ids, *sample.completion_ids]


def _trie(samples: Sequence[Sample]) -> tuple[list[int], list[int], list[int], list[list[int]]]:
    """The trie of the rows: each node's token, parent (-1 at a row's first token) and depth, in
    insertion order (a parent before its children), and each row's path of nodes."""
    children: dict[tuple[int, int], int] = {}
    node_ids: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    paths: list[list[int]] = []
    for sample in samples:
        parent = -1
        path: list[int] = []
        for depth, token in enumerate(_row(sample)):
            node = children.get((parent, token))
            if node is None:
                node = children[(parent, token)] = len(node_ids)
                node_ids.append(token)
                parents.append(parent)
                depths.append(depth)
            path.append(node)
            parent = node
        paths.append(path)
    return node_ids, parents, depths, paths


def build_token_tree(samples: Sequence[Sample]) -> TokenTree:
    """The trie of ``samples``' rows (``prompt_ids + completion_ids``), with the index maps that
    take per-node logprobs to the padded completion layout of ``pad_samples(samples)``."""
    if not samples:
        raise ValueError("no samples to build a token tree from")
    node_ids, parents, depths, paths = _trie(samples)
    width = max(len(s.completion_ids) for s in samples)
    scored: dict[int, int] = {}  # node -> slot
    gather_rows: list[list[int]] = []
    for sample, path in zip(samples, paths):
        p = len(sample.prompt_ids)
        row = []
        for j, on in enumerate(sample.loss_mask):
            if on and p + j > 0:  # a row's first token has no logits to be scored from
                row.append(scored.setdefault(path[p + j], len(scored)))
            else:
                row.append(-1)
        gather_rows.append(row + [-1] * (width - len(row)))
    scored_nodes = list(scored)
    logit_nodes = sorted({parents[k] for k in scored_nodes})
    position = {node: i for i, node in enumerate(logit_nodes)}
    blank = len(scored_nodes)
    gather = torch.tensor([[blank if s < 0 else s for s in row] for row in gather_rows], dtype=torch.long).reshape(len(samples), width)
    return TokenTree(
        node_ids=torch.tensor(node_ids, dtype=torch.long),
        parents=torch.tensor(parents, dtype=torch.long),
        depths=torch.tensor(depths, dtype=torch.long),
        logit_nodes=torch.tensor(logit_nodes, dtype=torch.long),
        scored_nodes=torch.tensor(scored_nodes, dtype=torch.long),
        logit_slot=torch.tensor([position[parents[k]] for k in scored_nodes], dtype=torch.long),
        gather=gather,
    )


def count_unique_tokens(samples: Sequence[Sample]) -> int:
    """The number of distinct token paths (trie nodes) among ``samples``' rows."""
    return len(_trie(samples)[0])


def tree_micro_batches(samples: Sequence[Sample], max_tokens: int | None) -> list[list[Sample]]:
    """Split ``samples`` into micro-batches whose token trees have at most ``max_tokens`` nodes
    (``None``: one micro-batch; a row longer than ``max_tokens`` goes alone).

    Rows are sorted by their token ids first, so rows that share a prefix (a task's group, an
    episode's calls, identical rows) are neighbours. When the next row does not fit, the
    micro-batch is cut between the two neighbours that share the fewest tokens (a cut repeats
    their shared prefix in the next tree): between two tasks' groups rather than inside one. Any
    partition is exact, since the loss's normaliser is the step's (:func:`~.loss.loss_normalizer`)."""
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1 or None, got {max_tokens}")
    rows = sorted(samples, key=_row)
    tokens = [_row(s) for s in rows]
    # shared[i]: the tokens row i shares with row i - 1, its longest shared prefix with any earlier row
    shared = [0] + [common_prefix_length(tokens[i - 1], tokens[i]) for i in range(1, len(rows))]
    if max_tokens is None:
        return [rows] if rows else []

    def nodes(first: int, end: int) -> int:  # the tree of rows[first:end]
        return len(tokens[first]) + sum(len(tokens[j]) - shared[j] for j in range(first + 1, end)) if end > first else 0

    batches: list[list[Sample]] = []
    first = 0  # rows[first:i] is the open micro-batch: within the budget, or one row longer than it
    for i in range(1, len(rows)):
        if nodes(first, i + 1) <= max_tokens:
            continue
        fits = [k for k in range(first + 1, i + 1) if nodes(k, i + 1) <= max_tokens]
        cut = min(fits, key=lambda k: (shared[k], -k)) if fits else i
        batches.append(rows[first:cut])
        first = cut
    if rows:
        batches.append(rows[first:])
    return batches


def packed_unsupported_reason(model: Any) -> str | None:
    """Why ``model`` cannot run the packed update (``None``: it can)."""
    config = getattr(model, "config", None)
    if config is None:
        return f"{type(model).__name__} has no transformers config"
    if getattr(config, "is_encoder_decoder", False):
        return f"{type(config).__name__} is an encoder-decoder model (the token tree needs a decoder-only causal LM)"
    attention = getattr(config, "_attn_implementation", None)
    if attention not in _TAKES_4D_MASK:
        return f"its attention implementation {attention!r} takes no custom 4D mask (sdpa and eager do)"
    return None


def tree_token_logps(
    model: Any, tree: TokenTree, batch: PaddedBatch, temperature: float, *, compute_entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token logprobs (and entropies) of ``batch``'s completion tokens, shaped like
    :func:`~.loss.per_token_logps`'s, from one forward over ``tree`` (built from the same rows in
    the same order). Columns outside the loss mask are 0: the loss multiplies them by 0."""
    from trl.trainer.utils import entropy_from_logits

    if tuple(tree.gather.shape) != tuple(batch.completion_mask.shape):
        raise ValueError(f"the token tree's rows {tuple(tree.gather.shape)} are not the batch's {tuple(batch.completion_mask.shape)}: build both from the same rows")
    reason = packed_unsupported_reason(model)
    if reason is not None:
        raise ValueError(f"cannot run the packed update: {reason}; set packed_update=False")
    dtype = next(model.parameters()).dtype
    inputs = {"input_ids": tree.node_ids[None], "attention_mask": tree.attention_mask(dtype), "position_ids": tree.depths[None], "use_cache": False}
    tokens = tree.node_ids[tree.scored_nodes]
    blank = torch.zeros(1, dtype=torch.float32, device=tokens.device)
    head = plain_lm_head(model)
    if head is not None:
        # The logits never exist: TRL's chunked kernel projects the parents' hidden states a
        # vocabulary tile at a time (and again in the backward), so the update's largest tensors,
        # (m x vocabulary) logits and their gradient, are a tile each instead.
        decoder, weight, bias = head
        hidden = decoder(**inputs).last_hidden_state[0, tree.logit_nodes]
        from trl.kernels import ChunkedLogProbFunction

        logps, entropy, *_ = ChunkedLogProbFunction.apply(
            hidden[tree.logit_slot], weight, bias, tokens, temperature, VOCAB_TILE, None, 1.0, ("entropy",) if compute_entropy else ()
        )
        per_column = torch.cat([logps, blank])[tree.gather]
        if entropy is not None:
            entropy = torch.cat([entropy.detach(), blank])[tree.gather]
        return per_column, entropy
    logits = model(**inputs, logits_to_keep=tree.logit_nodes).logits[0]
    # (m, vocab), one row per needed parent: the update's biggest tensor, so it is kept once (the
    # autograd graph holds no scaled copy, softmax or index buffers of it) and scanned in chunks.
    logits = logits.float()
    logps = _ChildLogprobs.apply(logits, tree.logit_slot, tokens, temperature)
    per_column = torch.cat([logps, blank])[tree.gather]
    entropy = None
    if compute_entropy:
        with torch.no_grad():
            per_parent = torch.cat([entropy_from_logits(chunk / temperature) for chunk in logits.split(_CHUNK)])
            entropy = torch.cat([per_parent[tree.logit_slot], blank])[tree.gather]
    return per_column, entropy


#: Rows of logits scanned at a time (each chunk's temporaries are rows x vocabulary).
_CHUNK = 128

#: Vocabulary columns projected at a time by the chunked LM head (a tile is tokens x this).
VOCAB_TILE = 8192

#: Config attributes by which a model scales or caps its logits in its own ``forward`` (TRL's
#: list): such a model's logits are not ``hidden @ lm_head.weight.T``, so they are computed whole.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling")


def plain_lm_head(model: Any) -> tuple[Any, torch.Tensor, torch.Tensor | None] | None:
    """``(decoder, weight, bias)`` when ``model``'s logits are exactly ``decoder(...)``'s last hidden
    states times a plain linear head (so they can be computed a tile at a time); ``None`` when
    they may not be (a LoRA on the head, a logit transform, no separate decoder) or the head's
    weights are sharded (FSDP, :mod:`.ranks`: only the model's own forward gathers them): then the
    update computes the logits whole, exactly as the model's forward does."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        return None
    try:
        decoder, head = model.get_decoder(), model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    config = getattr(model, "config", None)
    if decoder is None or decoder is model or type(head) is not torch.nn.Linear or config is None:
        return None
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    if any(getattr(text_config, name, None) is not None for name in _LOGIT_TRANSFORMS):
        return None
    return decoder, head.weight, head.bias


class _ChildLogprobs(torch.autograd.Function):
    """``log_softmax(logits[slot] / T)[token]`` for each (slot, token) pair — TRL's
    ``selective_log_softmax`` (the scaled logit minus the row's logsumexp) — with a hand-written
    backward that needs only the logits and the logsumexps: ``d/dlogits = (onehot - softmax) / T``
    per pair, summed over the pairs of a row. Autograd's own graph would keep the scaled logits
    and build two more (rows x vocabulary) tensors in the backward."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, slot: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
        logsumexp = torch.cat([torch.logsumexp(chunk / temperature, dim=-1) for chunk in logits.split(_CHUNK)])
        ctx.save_for_backward(logits, logsumexp, slot, tokens)
        ctx.temperature = temperature
        return logits[slot, tokens] / temperature - logsumexp[slot]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        logits, logsumexp, slot, tokens = ctx.saved_tensors
        t = ctx.temperature
        per_row = torch.zeros_like(logsumexp).index_add_(0, slot, grad)
        out = torch.empty_like(logits)
        for start in range(0, logits.shape[0], _CHUNK):
            rows = slice(start, start + _CHUNK)
            torch.exp(logits[rows] / t - logsumexp[rows, None], out=out[rows])
            out[rows].mul_(-per_row[rows, None])
        out.index_put_((slot, tokens), grad, accumulate=True)
        return out.div_(t), None, None, None
