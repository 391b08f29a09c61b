"""The ``hf`` decode's static KV cache (``HFPolicy(decode="static")`` / ``"compiled"``): a fixed
number of slots by a fixed number of columns, so every decode step has the same shapes, which is
what CUDA graphs need (a compiled step).
"""

from __future__ import annotations

import functools
from typing import Any

from agentgym_lightning.policies.hf_kv import Batch, cache_layers, kv_of
from agentgym_lightning.policies.hf_rows import Entry

__all__ = ["Slots", "remaining"]


class Slots:
    """The static KV cache of the per-step scheduler (``decode="static"``/``"compiled"``): a fixed
    number of slots (rows) by a fixed number of columns, so every decode step has the same shapes
    (what CUDA graphs need). Every running row's tokens end at column ``t`` (the fed token's keys
    and values are written there, in every slot); a row that joins is copied into a free slot,
    right-aligned; a row that ends frees its slot. ``mask`` marks each slot's cached columns.
    The columns no row uses any more are dropped (everything shifted left) when a row joins."""

    def __init__(self, template: Any, slots: int, columns: int) -> None:
        import torch

        layers = cache_layers(template)
        self.device, self.dtype = layers[0].keys.device, layers[0].keys.dtype
        self.column = torch.zeros(1, dtype=torch.long, device=self.device)
        layer_class = slot_layer_class()
        self.layers = [
            layer_class(
                layer.keys.new_zeros((slots, layer.keys.shape[1], columns, layer.keys.shape[3])),
                layer.values.new_zeros((slots, layer.values.shape[1], columns, layer.values.shape[3])),
                self.column,
            )
            for layer in layers
        ]
        self.cache = slot_cache_class()(self.layers)
        self.entries: list[Entry | None] = [None] * slots
        self.mask = torch.zeros((slots, columns), dtype=torch.bool, device=self.device)
        self.feed = torch.zeros((slots, 1), dtype=torch.long, device=self.device)
        self.positions = torch.zeros((slots, 1), dtype=torch.long, device=self.device)
        self.t = 0  # the column the next step writes

    @property
    def columns(self) -> int:
        """Columns of each slot."""
        return self.mask.shape[1]

    def live(self) -> list[tuple[int, Entry]]:
        """``(slot, entry)`` of every running row."""
        return [(slot, entry) for slot, entry in enumerate(self.entries) if entry is not None]

    def prefix_kv(self, slot: int, shared: int) -> list[tuple[Any, Any]]:
        """Each layer's keys and values of the first ``shared`` cached tokens of ``slot``."""
        return kv_of(self.layers, slot, self.mask[slot, : self.t], shared)

    def ended_kv(self, slot: int) -> list[tuple[Any, Any]]:
        """Each layer's keys and values of every token of ``slot`` after a step (the fed one's too,
        written at column ``t``)."""
        return kv_of(self.layers, slot, self.mask[slot, : self.t + 1])

    def place(self, joining: Batch) -> list[int]:
        """Copy the rows of ``joining`` (a prefilled batch) into free slots; returns the rows that
        did not fit (too long for the columns left, or no free slot), for a dynamic batch."""
        import torch

        width = joining.attention_mask.shape[1] - 1  # its cached columns (the last: the fed token's)
        live = self.live()
        used = self.mask[:, : self.t].any(0).nonzero()
        self._shift(-(int(used[0]) if len(used) else self.t))  # drop the columns no row uses
        free = [slot for slot, entry in enumerate(self.entries) if entry is None]
        left = [remaining(e) for _, e in live]
        rows, rest = [], []
        for b, entry in enumerate(joining.entries):
            if free and max(self.t, width) + max([*left, remaining(entry)]) <= self.columns:
                rows.append((b, free.pop(0)))
                left.append(remaining(entry))
            else:
                rest.append(b)
        if not rows:
            return rest
        self._shift(max(0, width - self.t))  # room on the left for its prompt
        start = self.t - width
        source = cache_layers(joining.cache)
        index = torch.tensor([b for b, _ in rows], device=self.device)
        slots = torch.tensor([s for _, s in rows], device=self.device)
        for mine, theirs in zip(self.layers, source):
            mine.keys[slots, :, start : self.t] = theirs.keys[index]
            mine.values[slots, :, start : self.t] = theirs.values[index]
        self.mask[slots] = False
        self.mask[slots, start : self.t] = joining.attention_mask[index, :width].bool()
        self.feed[slots] = joining.feed[index]
        self.positions[slots] = joining.positions[index]
        for b, slot in rows:
            self.entries[slot] = joining.entries[b]
        return rest

    def _shift(self, by: int) -> None:
        """Move every slot's columns ``by`` to the right (left when negative), in place (CUDA
        graphs hold these tensors' addresses)."""
        if not by:
            return
        n = self.columns - abs(by)
        for tensor in [self.mask, *(t for layer in self.layers for t in (layer.keys, layer.values))]:
            view = tensor if tensor.dim() == 2 else tensor.transpose(1, 2)  # columns on dim 1
            if by > 0:
                view[:, by:] = view[:, :n].clone()
                view[:, :by] = 0
            else:
                view[:, :n] = view[:, -by:].clone()
                view[:, n:] = 0
        self.t += by


def remaining(entry: Entry) -> int:
    """Tokens ``entry`` may still sample (each takes one decode step, one column)."""
    return entry.row.max_tokens - len(entry.tokens)


@functools.cache
def slot_layer_class() -> type:
    """The KV cache layer of :class:`Slots` (made on first use: transformers loads lazily here)."""
    from transformers.cache_utils import CacheLayerMixin

    class SlotLayer(CacheLayerMixin):
        """Keys and values of fixed shape ``(slots, heads, columns, dim)``; a forward pass writes
        its one token per slot at the shared column ``column`` (a 1-element tensor, set before
        each step, so a compiled step reads it rather than baking it in)."""

        is_compileable = True
        is_sliding = False

        def __init__(self, keys: Any, values: Any, column: Any) -> None:
            super().__init__()
            self.keys, self.values, self.column = keys, values, column
            self.is_initialized = True
            import torch

            for tensor in (keys, values, column):
                torch._dynamo.mark_static_address(tensor)

        def lazy_initialization(self, key_states: Any, value_states: Any = None) -> None:  # allocated up front
            return None

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            self.keys.index_copy_(2, self.column, key_states)
            self.values.index_copy_(2, self.column, value_states)
            return self.keys, self.values

        def get_mask_sizes(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
            return self.keys.shape[2], 0

        def get_seq_length(self, *args: Any, **kwargs: Any) -> int:
            return 0  # (positions and the 4D mask are given: nothing is derived from it)

        def get_max_length(self) -> int:
            return self.keys.shape[2]

    return SlotLayer


@functools.cache
def slot_cache_class() -> type:
    """The KV cache of :class:`Slots`' layers (made on first use, as :func:`slot_layer_class`)."""
    from transformers.cache_utils import Cache

    class SlotCache(Cache):
        """A cache of :func:`slot_layer_class` layers."""

        def __init__(self, layers: list[Any]) -> None:
            super().__init__(layers=layers)

    return SlotCache
