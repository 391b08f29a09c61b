"""Keys and values kept after a call ends, so the next call that begins with the same tokens
prefills only the rest (the ``hf`` backend's prefix cache across calls and episodes).

An agent's second call sends its whole conversation again: the first prompt, the completion we
generated, the tool's result and a few new tokens; the G episodes of a task, and every episode of
an agent, send the same system prompt. The per-step scheduler (:mod:`~agentgym_lightning.policies.hf`)
already shares prefixes among rows that decode *at the same moment*; this cache keeps a row's
keys and values once it has ended (its prompt and its completion but the last token, whose keys
were never computed), least recently used first out, within a byte budget, and a newcomer whose
prompt begins with one of them computes only what follows. This is vLLM's automatic prefix
caching and SGLang's radix cache in spirit, kept simple: whole sequences, no shared blocks (a
sequence that a newer one extends is dropped, so an episode holds one entry, its latest call).

Entries are keyed by the adapter that computed them and by the weights they were computed with:
:meth:`PrefixCache.sync` empties the cache when the generator's weights change (an update, a
weight copy at ``max_staleness`` >= 1), so stale keys and values are never served.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from agentgym_lightning.llm import common_prefix_length

__all__ = ["PrefixCache", "DEFAULT_PREFIX_CACHE_MB"]

#: The default budget: the keys and values of about 11,000 tokens of SmolLM2-135M in fp32 (46 KB a
#: token), a few hundred calls of the main job, well inside its 3 GB.
DEFAULT_PREFIX_CACHE_MB = 512.0


@dataclass
class _Stored:
    ids: tuple[int, ...]
    adapter: str | None
    kv: list[tuple[Any, Any]]  # per layer: keys and values of shape (1, heads, len(ids), dim)
    nbytes: int


class PrefixCache:
    """Sequences' keys and values, least recently used out first, within ``budget_bytes``.

    Args:
        budget_bytes: the most bytes of keys and values held; ``0`` holds nothing.
        min_shared: the shortest prefix worth reusing (a forward pass of its own costs more).
    """

    def __init__(self, budget_bytes: int, min_shared: int = 16) -> None:
        if budget_bytes < 0:
            raise ValueError(f"the prefix cache's budget must be >= 0 bytes, got {budget_bytes}")
        self.budget_bytes = int(budget_bytes)
        self.min_shared = min_shared
        self._entries: OrderedDict[int, _Stored] = OrderedDict()
        self._next_key = 0
        self._version: Hashable = None
        self.nbytes = 0
        #: Newcomers that took their prefix from here, and the prompt tokens they did not compute.
        self.hits = 0
        self.tokens_reused = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        """Tokens whose keys and values are held."""
        return sum(len(e.ids) for e in self._entries.values())

    def sync(self, version: Hashable) -> None:
        """Empty the cache when ``version`` (the generator's weights) differs from the last one."""
        if version != self._version:
            self.clear()
            self._version = version

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0

    def match(self, ids: Sequence[int], adapter: str | None) -> tuple[int, int] | None:
        """The entry (computed with ``adapter``) sharing the longest prefix with ``ids``, and that
        prefix's length, leaving ``ids`` at least one token of its own (its logits come from it);
        ``None`` when none shares ``min_shared`` tokens."""
        best: tuple[int, int] | None = None
        for key, entry in self._entries.items():
            if entry.adapter != adapter or entry.ids[: self.min_shared] != tuple(ids[: self.min_shared]):
                continue
            shared = min(common_prefix_length(ids, entry.ids), len(ids) - 1)
            if shared >= self.min_shared and (best is None or shared > best[1]):
                best = (key, shared)
        return best

    def prefix_kv(self, key: int, shared: int) -> list[tuple[Any, Any]]:
        """Each layer's keys and values of the first ``shared`` tokens of entry ``key`` (views:
        the caller's cache copies them as it grows), counted as a hit."""
        entry = self._entries[key]
        self._entries.move_to_end(key)
        self.hits += 1
        self.tokens_reused += shared
        return [(k[:, :, :shared], v[:, :, :shared]) for k, v in entry.kv]

    def put(self, ids: Sequence[int], adapter: str | None, kv: list[tuple[Any, Any]]) -> None:
        """Keep ``kv`` (each layer's keys and values of exactly ``ids``, batch 1) for ``ids``.
        Entries ``ids`` extends are dropped (every match they gave, it gives); the least recently
        used go until the budget holds; a sequence larger than the budget is not kept."""
        nbytes = sum(t.numel() * t.element_size() for pair in kv for t in pair)
        if not ids or nbytes > self.budget_bytes:
            return
        ids = tuple(ids)
        for key, entry in list(self._entries.items()):
            if entry.adapter == adapter and len(entry.ids) <= len(ids) and ids[: len(entry.ids)] == entry.ids:
                self._drop(key)
        while self._entries and self.nbytes + nbytes > self.budget_bytes:
            self._drop(next(iter(self._entries)))
        # Copies of exactly these columns: a view would keep the whole batch's cache alive.
        kept = [(k.contiguous().clone(), v.contiguous().clone()) for k, v in kv]
        self._entries[self._next_key] = _Stored(ids, adapter, kept, nbytes)
        self._next_key += 1
        self.nbytes += nbytes

    def _drop(self, key: int) -> None:
        self.nbytes -= self._entries.pop(key).nbytes
