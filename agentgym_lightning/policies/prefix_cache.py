"""Keys and values kept after a call ends, so the next call that begins with the same tokens
prefills only the rest (the ``hf`` backend's prefix cache across calls and episodes).

An agent's second call sends its whole conversation again: the first prompt, the completion we
generated, the tool's result and a few new tokens; the G episodes of a task, and every episode of
an agent, send the same system prompt. The per-step scheduler (:mod:`~agentgym_lightning.policies.hf_scheduler`)
already shares prefixes among rows that decode *at the same moment*; this cache keeps a row's
keys and values once it has ended (its prompt and its completion but the last token, whose keys
were never computed), least recently used first out, within a byte budget, and a newcomer whose
prompt begins with one of them computes only what follows. This is vLLM's automatic prefix
caching and SGLang's radix cache in spirit: a sequence that begins with a kept one holds only its
own tail and points at the kept one for the rest (an episode's calls form a chain, the episodes of
a task share their system prompt's keys and values once), and a sequence that a newer one extends
is no longer offered itself (the newer one gives every match it gave).

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


@dataclass(eq=False)
class _Stored:
    """A kept sequence: its first ``start`` tokens' keys and values are ``base``'s, the rest its own."""

    ids: tuple[int, ...]
    adapter: str | None
    base: _Stored | None
    start: int
    tail: list[tuple[Any, Any]]  # per layer: keys and values of ids[start:], shape (1, heads, len, dim)
    nbytes: int  # the tail's
    users: int = 0  # kept sequences built on this one
    listed: bool = True  # offered to matches (and evicted in turn); an unlisted one lives while it has users

    def kv(self, n: int) -> list[tuple[Any, Any]]:
        """Each layer's keys and values of the first ``n`` tokens (views when one tail holds them)."""
        parts, node = [], self
        while n > 0:
            assert node is not None
            if n > node.start:
                parts.append([(k[:, :, : n - node.start], v[:, :, : n - node.start]) for k, v in node.tail])
                n = node.start
            node = node.base
        if len(parts) == 1:
            return parts[0]
        import torch

        parts.reverse()
        return [(torch.cat([part[i][0] for part in parts], dim=2), torch.cat([part[i][1] for part in parts], dim=2))
                for i in range(len(parts[0]))]


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
        self._entries: OrderedDict[int, _Stored] = OrderedDict()  # the listed ones, least recently used first
        self._next_key = 0
        self._version: Hashable = None
        #: Bytes of keys and values held (listed sequences and the ones they build on).
        self.nbytes = 0
        #: Tokens whose keys and values are held (each held once).
        self.tokens = 0
        #: Newcomers that took their prefix from here, and the prompt tokens they did not compute.
        self.hits = 0
        self.tokens_reused = 0

    def __len__(self) -> int:
        return len(self._entries)

    def sync(self, version: Hashable) -> None:
        """Empty the cache when ``version`` (the generator's weights) differs from the last one."""
        if version != self._version:
            self.clear()
            self._version = version

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = self.tokens = 0

    def match(self, ids: Sequence[int], adapter: str | None) -> tuple[int, int] | None:
        """The sequence (computed with ``adapter``) sharing the longest prefix with ``ids``, and
        that prefix's length, leaving ``ids`` at least one token of its own (its logits come from
        it); ``None`` when none shares ``min_shared`` tokens."""
        found = self._longest(ids, adapter)
        if found is None:
            return None
        key, shared = found
        shared = min(shared, len(ids) - 1)
        return (key, shared) if shared >= self.min_shared else None

    def prefix_kv(self, key: int, shared: int) -> list[tuple[Any, Any]]:
        """Each layer's keys and values of the first ``shared`` tokens of sequence ``key`` (the
        caller's cache copies them as it grows), counted as a hit."""
        self._entries.move_to_end(key)
        self.hits += 1
        self.tokens_reused += shared
        return self._entries[key].kv(shared)

    def put(self, ids: Sequence[int], adapter: str | None, kv: list[tuple[Any, Any]]) -> None:
        """Keep ``kv`` (each layer's keys and values of exactly ``ids``, batch 1) for ``ids``: only
        what follows the longest kept prefix of it is copied. Sequences ``ids`` extends are no
        longer offered; the least recently used go until the budget holds; a tail larger than
        the budget is not kept."""
        ids = tuple(ids)
        found = self._longest(ids, adapter)
        base, start = (self._entries[found[0]], found[1]) if found is not None and found[1] >= self.min_shared else (None, 0)
        if base is not None and start == len(ids):  # held already
            self._entries.move_to_end(found[0])  # type: ignore[index]
            return
        tail = [(k[:, :, start:], v[:, :, start:]) for k, v in kv]
        nbytes = sum(t.numel() * t.element_size() for pair in tail for t in pair)
        if not ids or nbytes > self.budget_bytes:
            return
        # Copies of exactly these columns: a view would keep the whole batch's cache alive.
        stored = _Stored(ids, adapter, base, start, [(k.contiguous().clone(), v.contiguous().clone()) for k, v in tail], nbytes)
        if base is not None:
            base.users += 1
        for key, entry in list(self._entries.items()):
            if entry.adapter == adapter and len(entry.ids) <= len(ids) and ids[: len(entry.ids)] == entry.ids:
                self._unlist(key)
        self._entries[self._next_key] = stored
        self._next_key += 1
        self.nbytes += nbytes
        self.tokens += len(ids) - start
        while self.nbytes > self.budget_bytes and self._entries:  # (the new one too, if its chain is too large)
            self._unlist(next(iter(self._entries)))

    def _longest(self, ids: Sequence[int], adapter: str | None) -> tuple[int, int] | None:
        best: tuple[int, int] | None = None
        head = tuple(ids[: self.min_shared])
        for key, entry in self._entries.items():
            if entry.adapter != adapter or entry.ids[: self.min_shared] != head:
                continue
            shared = common_prefix_length(ids, entry.ids)
            if best is None or shared > best[1]:
                best = (key, shared)
        return best

    def _unlist(self, key: int) -> None:
        entry = self._entries.pop(key)
        entry.listed = False
        self._release(entry)

    def _release(self, entry: _Stored | None) -> None:
        """Free unlisted sequences no kept one builds on, down the chain."""
        while entry is not None and not entry.listed and entry.users == 0:
            self.nbytes -= entry.nbytes
            self.tokens -= len(entry.ids) - entry.start
            base, entry.tail = entry.base, []
            if base is not None:
                base.users -= 1
            entry = base
