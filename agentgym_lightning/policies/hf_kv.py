"""The ``hf`` decode's dynamic KV cache: how a prefill lays out prompts that share prefixes, and
the running batch whose rows join and leave between decode steps.

A prefill lays its prompts out in three segments, each padded on its left (:func:`prompt_inputs`):
the prefix every row shares (a system prompt), the prefix a row shares with the others of its
*prefix group* (the G episodes of a task sending the same first prompt), and the row's own rest;
the first two are computed once each. The running :class:`Batch` keeps every row's tokens
right-aligned in one left-padded cache: rows that join are padded to a common width
(:func:`merge`), rows that end leave it and the columns no row needs any more are cropped
(:func:`next_batch`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentgym_lightning.llm import BASE_ADAPTER, common_prefix_length
from agentgym_lightning.policies.hf_rows import Entry, Row

__all__ = [
    "MIN_SHARED_PREFIX", "Batch", "adapter_kwarg", "adapter_names", "cache_argument", "cache_kwarg", "cache_layers",
    "cacheable_prefix", "crop_left", "kv_of", "merge", "new_cache", "next_batch", "prefill_count", "prefix_layout",
    "prompt_inputs",
]

#: Shared prefixes shorter than this are not worth a forward pass of their own.
MIN_SHARED_PREFIX = 16
#: Columns a growing KV layer allocates beyond what it holds: at least this many, an eighth more
#: when that is more. Half as many again held 1.5x the batch's keys and values (the main job's
#: peak RSS went over 3 GB, docs/training.md) for copies that rows joining or leaving make anyway.
_MIN_ROOM = 64
_ROOM_SHARE = 8


def new_cache(model: Any) -> Any:
    """An empty KV cache for ``model`` whose plain layers grow in place (:func:`growing_layer_class`);
    a model with other kinds of layers (sliding-window, hybrid) gets transformers' own."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=model.config)
    if all(type(layer) is DynamicLayer for layer in cache.layers):
        cache.layers = [growing_layer_class()() for _ in cache.layers]
    return cache


@functools.cache
def growing_layer_class() -> type:
    """transformers' ``DynamicLayer`` whose keys and values are the front of a larger buffer (made
    on first use: transformers loads lazily here). ``DynamicLayer.update`` concatenates, so every
    decode step copies every cached key and value of the batch; here a step writes its token's
    into the room left (:data:`_MIN_ROOM` columns, or an eighth more), and only a full buffer, or keys
    and values replaced from outside (rows that joined, left or were cropped), are copied into a new one."""
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        buffers: tuple[Any, Any] | None = None

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            held = self.keys.shape[-2] if self.keys.dim() == 4 else 0
            end = held + key_states.shape[-2]
            if not self._fronts_buffers(end):
                batch, heads, _, dim = key_states.shape
                room = end + max(_MIN_ROOM, end // _ROOM_SHARE)
                self.buffers = (key_states.new_empty((batch, heads, room, dim)), value_states.new_empty((batch, heads, room, dim)))
                if held:
                    self.buffers[0][:, :, :held] = self.keys
                    self.buffers[1][:, :, :held] = self.values
            keys, values = self.buffers  # type: ignore[misc]
            keys[:, :, held:end] = key_states
            values[:, :, held:end] = value_states
            self.keys, self.values = keys[:, :, :end], values[:, :, :end]
            return self.keys, self.values

        def _fronts_buffers(self, end: int) -> bool:
            """Whether the held keys and values are still the front of the buffers, with room to ``end``."""
            if self.buffers is None or self.keys.dim() != 4:
                return False
            return all(
                held.data_ptr() == buffer.data_ptr() and held.shape[:2] == buffer.shape[:2]
                and held.stride() == buffer.stride() and buffer.shape[2] >= end
                for held, buffer in zip((self.keys, self.values), self.buffers)
            )

    return GrowingLayer


def cacheable_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """The prefix all ``prompts`` share, less what leaves each at least one token of its own."""
    return min(common_prefix_length(*prompts), min(len(p) for p in prompts) - 1)


def prefix_layout(prompts: Sequence[Sequence[int]], adapters: Sequence[str | None] | None = None) -> tuple[int, list[list[int]]]:
    """How a batch's prompts share prefixes: the length of the prefix all of them share, and the
    *prefix groups* (lists of row indices) of rows sharing at least :data:`MIN_SHARED_PREFIX`
    more tokens (runs of neighbours in sorted order). Every row keeps at least one token outside
    both (the one whose logits start its completion); prefixes too short to pay for a forward
    pass of their own count as none. With ``adapters`` (one per row), only rows of the same
    adapter share a prefix: the batch-wide one needs a single adapter, a group one adapter each."""
    if len(prompts) < 2:
        return 0, []
    keys = list(adapters) if adapters is not None else [None] * len(prompts)
    shared = cacheable_prefix(prompts) if len(set(keys)) == 1 else 0
    if shared < MIN_SHARED_PREFIX:
        shared = 0
    order = sorted(range(len(prompts)), key=lambda b: (keys[b] or "", prompts[b]))
    runs: list[list[int]] = [[order[0]]]
    for before, b in zip(order, order[1:]):
        if keys[before] == keys[b] and common_prefix_length(prompts[before], prompts[b]) >= shared + MIN_SHARED_PREFIX:
            runs[-1].append(b)
        else:
            runs.append([b])
    groups = []
    for run in runs:
        if len(run) > 1 and cacheable_prefix([prompts[b] for b in run]) >= shared + MIN_SHARED_PREFIX:
            groups.append(sorted(run))
    return shared, groups


def prefill_count(prompts: Sequence[Sequence[int]], shared: int, groups: list[list[int]]) -> int:
    """Prompt tokens a prefill laid out as :func:`prefix_layout` says computes: the batch prefix
    once, each prefix group's segment once, every row's rest."""
    ends = [shared] * len(prompts)
    total = shared
    for members in groups:
        end = cacheable_prefix([prompts[b] for b in members])
        total += end - shared
        for b in members:
            ends[b] = end
    return total + sum(len(p) - end for p, end in zip(prompts, ends))


def cache_kwarg(model: Any, cache: Any) -> dict[str, Any]:
    """``{name: cache}`` for ``model``'s forward: transformers renamed ``past_key_values`` to
    ``cache`` (the old name still works there, with a warning on every call). Read from the
    signature, not the version, so both kinds of transformers get the name they take."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # (a PEFT model passes it on)
    return {cache_argument(type(base)): cache}


@functools.cache
def cache_argument(model_class: type) -> str:
    """The name ``model_class.forward`` takes its KV cache under."""
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def adapter_names(model: Any, rows: Sequence[Row]) -> list[str] | None:
    """PEFT's ``adapter_names`` for a batch of ``rows`` (one per row), or ``None`` when every row
    runs on the active adapter (the plain forward: nothing to route)."""
    if all(r.adapter is None for r in rows) or not getattr(model, "peft_config", None):
        return None  # (a model without adapters is the base model: the policy refused any other name)
    active = getattr(model, "active_adapter", None)
    names = [r.adapter or active or BASE_ADAPTER for r in rows]
    return None if all(n == active for n in names) else names


def adapter_kwarg(names: list[str] | None) -> dict[str, Any]:
    """The forward's ``adapter_names`` argument, when there are names to route."""
    return {} if names is None else {"adapter_names": names}


def prompt_inputs(
    model: Any, rows: Sequence[Row], layout: tuple[int, list[list[int]]], *, pad_token_id: int, device: Any,
    names: list[str] | None = None,
) -> tuple[Any, Any, Any]:
    """The batch's ``input_ids`` and ``attention_mask`` and, when ``layout`` (the rows' prompts'
    :func:`prefix_layout`; ``(0, [])``: none) shares a prefix, the KV cache of the shared
    prefixes (else ``None``).

    With no shared prefix the rows are left-padded. Else the prompts are laid out in three
    segments, each padded on its left: the prefix every row shares, the prefix a row shares with
    its prefix group, and the row's own rest. The first two are computed here once each (the
    batch prefix with batch 1, then each group's segment with one row per group, on top of it)
    and their keys and values copied to the rows; the prefill then runs only the rests. Padding
    is masked out and position ids count unmasked tokens only, so every row sees exactly its own
    prompt at its own positions, as with left padding. With ``names`` (PEFT's ``adapter_names``,
    one per row), each prefix is computed with its rows' adapter."""
    import torch

    prompts = [r.prompt_ids for r in rows]
    shared, groups = layout
    group_of = [0] * len(rows)  # group 0: rows in no group (an empty segment)
    ends = [shared]
    for g, members in enumerate(groups, start=1):
        for b in members:
            group_of[b] = g
        ends.append(cacheable_prefix([prompts[b] for b in members]))
    group_width = max(end - shared for end in ends)
    rest_width = max(len(p) - ends[group_of[b]] for b, p in enumerate(prompts))
    width = shared + group_width + rest_width
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, p in enumerate(prompts):
        end = ends[group_of[b]]
        for stop, tokens in ((shared, p[:shared]), (shared + group_width, p[shared:end]), (width, p[end:])):
            if tokens:  # right-aligned in its segment, which ends at `stop`
                input_ids[b, stop - len(tokens) : stop] = torch.tensor(tokens)
                attention_mask[b, stop - len(tokens) : stop] = 1
    input_ids = input_ids.to(device)
    attention_mask = attention_mask.to(device)
    if not shared and not groups:
        return input_ids, attention_mask, None
    cache = new_cache(model)
    with torch.inference_mode():
        # logits_to_keep=1: the prefixes' own logits are never used; skip most of the LM head.
        if shared:
            model(input_ids=input_ids[:1, :shared], **cache_kwarg(model, cache), use_cache=True, logits_to_keep=1,
                  **adapter_kwarg(None if names is None else names[:1]))
        if groups:
            used = sorted(set(group_of))  # group 0 only if some row is in no group
            first = [group_of.index(g) for g in used]  # one row of each: its segment stands for all
            cache.batch_repeat_interleave(len(used))
            mask = attention_mask[first, : shared + group_width]
            positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, shared:]
            model(input_ids=input_ids[first, shared : shared + group_width], attention_mask=mask, position_ids=positions,
                  **cache_kwarg(model, cache), use_cache=True, logits_to_keep=1,
                  **adapter_kwarg(None if names is None else [names[b] for b in first]))
            cache.batch_select_indices(torch.tensor([used.index(g) for g in group_of], device=device))
        else:
            cache.batch_repeat_interleave(len(rows))
    return input_ids, attention_mask, cache


def cache_layers(cache: Any) -> list[Any]:
    """``cache``'s layers, which must be plain ones (transformers' ``DynamicLayer``): rows join
    and leave by concatenating and slicing their keys and values."""
    from transformers.cache_utils import DynamicLayer

    layers = cache.layers
    for layer in layers:
        if type(layer) not in (DynamicLayer, growing_layer_class()):
            raise NotImplementedError(
                f"the hf policy's decode joins KV caches of plain layers only (transformers' DynamicLayer); this "
                f"model's cache has {type(layer).__name__} layers (a sliding-window or hybrid attention model), "
                "which the hf backend does not serve: serve it with the vllm backend (`--backend vllm`) or any "
                "OpenAI-compatible server (`--backend openai`)"
            )
    return layers


def kv_of(layers: Sequence[Any], row: int, attended: Any, n: int | None = None) -> list[tuple[Any, Any]]:
    """Each layer's keys and values (batch 1) of row ``row``'s first ``n`` (all: ``None``) tokens,
    those of the columns ``attended`` (the row's mask, over the columns looked at) marks."""
    columns = attended.nonzero().squeeze(1)[:n]
    return [(layer.keys[row : row + 1, :, columns], layer.values[row : row + 1, :, columns]) for layer in layers]


def crop_left(cache: Any, columns: int) -> None:
    """Drop ``cache``'s first ``columns`` columns (padding no row attends to any more)."""
    for layer in cache_layers(cache):
        layer.keys, layer.values = layer.keys[:, :, columns:], layer.values[:, :, columns:]


@dataclass
class Batch:
    """The running batch, ready for its next forward pass: ``feed`` (one token per row),
    ``positions`` (each row's), ``attention_mask`` (the cached columns, then the fed token's)
    and the KV ``cache`` of every row, each row's tokens right-aligned."""

    entries: list[Entry]
    feed: Any
    positions: Any
    attention_mask: Any
    cache: Any

    def live(self) -> list[tuple[int, Entry]]:
        """``(row, entry)`` of every running row."""
        return list(enumerate(self.entries))

    def prefix_kv(self, row: int, shared: int) -> list[tuple[Any, Any]]:
        """Each layer's keys and values of the first ``shared`` cached tokens of ``row``."""
        return kv_of(cache_layers(self.cache), row, self.attention_mask[row, :-1], shared)  # (the last column: the fed token)


def next_batch(entries: list[Entry], keep: list[int], tokens: list[int], positions: Any, attention_mask: Any,
               cache: Any, device: Any) -> Batch:
    """The batch of the ``keep`` rows, ready to feed ``tokens``: ``positions`` (one column) are
    those of the last forward pass, ``attention_mask`` its mask; the columns that no row attends
    to any more (padding left of every row) are cropped."""
    import torch

    index = torch.tensor(keep, device=device)
    if len(keep) < attention_mask.shape[0]:
        cache.batch_select_indices(index)
        attention_mask, positions = attention_mask[index], positions[index]
    first = int(attention_mask.any(0).to(torch.int8).argmax())
    if first:
        attention_mask = attention_mask[:, first:]
        crop_left(cache, first)
    attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(keep), 1))], dim=1)
    return Batch(entries, torch.tensor(tokens, device=device)[:, None], positions + 1, attention_mask, cache)


def merge(running: Batch | None, joining: Batch | None) -> Batch | None:
    """One batch of both (the narrower one's cache and mask padded on the left)."""
    import torch
    import torch.nn.functional as F

    if running is None or joining is None:
        return running or joining
    width = max(running.attention_mask.shape[1], joining.attention_mask.shape[1])
    for batch in (running, joining):
        pad = width - batch.attention_mask.shape[1]
        if pad:
            batch.attention_mask = F.pad(batch.attention_mask, (pad, 0))
            for layer in cache_layers(batch.cache):
                layer.keys, layer.values = F.pad(layer.keys, (0, 0, pad, 0)), F.pad(layer.values, (0, 0, pad, 0))
    for mine, theirs in zip(cache_layers(running.cache), cache_layers(joining.cache)):
        mine.keys = torch.cat([mine.keys, theirs.keys])
        mine.values = torch.cat([mine.values, theirs.values])
    return Batch(
        running.entries + joining.entries,
        torch.cat([running.feed, joining.feed]),
        torch.cat([running.positions, joining.positions]),
        torch.cat([running.attention_mask, joining.attention_mask]),
        running.cache,
    )
