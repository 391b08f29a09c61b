"""The ``hf`` backend's one decode loop: iteration-level (per-step) scheduling of submitted requests.

:class:`StepScheduler` runs on a thread of its own. Each iteration it takes the requests
submitted since the last one (as many as fit in ``max_batch_size``), prefills them, samples their
first tokens and merges them into the running batch, then runs one decode step for every running
row; a row that ends leaves the batch at once and its future resolves. ``HFPolicy.generate`` and
``HFPolicy.submit`` both come here.

The seam to the policy is :class:`DecodeHost`: the public attributes the loop reads, live (a
trainer swaps the model in, asynchronous training changes ``decode_threads``), its weights'
version and the lock in which weights change. The loop counts prompt tokens in a
:class:`PrefillCounts` the policy owns.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Hashable
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from agentgym_lightning.llm import Completion, common_prefix_length
from agentgym_lightning.policies.chat import completion_of
from agentgym_lightning.policies.hf_kv import (
    MIN_SHARED_PREFIX, Batch, adapter_kwarg, adapter_names, cache_kwarg, cache_layers, kv_of, merge, new_cache, next_batch,
    prefill_count, prefix_layout, prompt_inputs,
)
from agentgym_lightning.policies.hf_rows import Entry, Sampler, Sampling, ended
from agentgym_lightning.policies.hf_slots import Slots
from agentgym_lightning.policies.prefix_cache import PrefixCache

__all__ = ["DecodeHost", "PrefillCounts", "StepScheduler"]

log = logging.getLogger("agentgym_lightning.policies.hf")  # the hf policy's log, as before the loop had a module of its own


class DecodeHost(Protocol):
    """What :class:`StepScheduler` reads from its policy (:class:`~agentgym_lightning.policies.hf.HFPolicy`),
    each time it needs it."""

    #: The causal LM decoded with (a trainer may swap in another, e.g. a PEFT wrapper).
    hf_model: Any
    tokenizer: Any
    #: The model's name, recorded in each :class:`Completion`.
    model: str
    device: Any
    max_batch_size: int
    #: The decode step to start with: ``"dynamic"``, ``"static"`` or ``"compiled"``.
    decode: str
    static_cache_len: int
    #: Share prompt prefixes among rows and, with a non-zero budget, across calls.
    prefix_caching: bool
    prefix_cache: PrefixCache
    #: torch threads for the decode (``None``: the process's).
    decode_threads: int | None
    pad_token_id: int
    #: EOS and the policy's stop tokens.
    stop_token_ids: frozenset[int]

    def weights_version(self) -> Hashable:
        """A value that changes whenever the model's weights do."""
        ...

    def paused(self) -> AbstractContextManager[Any]:
        """The lock each prefill and step holds (weights change only outside it)."""
        ...


@dataclass
class PrefillCounts:
    """Prompt tokens of the calls that keep keys and values across calls (``submit``'s), and of
    them those computed (not taken from a running row or the prefix cache)."""

    prompt_tokens: int = 0
    prefilled_tokens: int = 0


class StepScheduler:
    """Iteration-level scheduling for an ``hf`` policy (see the module docstring).

    A newcomer is prefilled on a running row's prefix when one shares it, or on the prefix
    cache's, else together with the other newcomers in the prefix layout
    (:func:`~agentgym_lightning.policies.hf_kv.prefix_layout`), so the G first prompts of a task
    that arrive together compute their shared prefix once. Rows of different ``(temperature,
    top_p)`` share the batch: each is sampled with its own warpers, a seeded row from its own
    generator, so its tokens do not depend on its batch-mates. Each iteration holds the host's
    lock (:meth:`DecodeHost.paused`).

    The running batch is dynamic (``decode="dynamic"``: its KV cache and mask left-padded to a
    common width when rows join, the leading columns no row needs cropped) or static
    (:class:`~agentgym_lightning.policies.hf_slots.Slots`, ``decode="static"``/``"compiled"``),
    with a dynamic batch beside it for the rows too long for its columns.
    """

    def __init__(self, host: DecodeHost, counts: PrefillCounts) -> None:
        self.host = host
        self.counts = counts
        self.queue: deque[Entry] = deque()
        self.wake = threading.Condition()
        self.closed = False
        self.samplers: dict[Sampling, Sampler] = {}
        self.mode = host.decode
        self.batch: Batch | None = None  # the dynamic batch
        self.slots: Slots | None = None  # the static one (made on first use)
        self.compiled: tuple[Any, Any] | None = None  # (model, its compiled forward)
        self.said: set[str] = set()
        self.threads: int | None = None  # the decode_threads this thread last set
        self._version: Any = None  # the weights this iteration runs with (read once, when first needed)
        self._version_read = False
        self.thread = threading.Thread(target=self._serve, name="hf-step-scheduler", daemon=True)
        self.thread.start()

    def put(self, *entries: Entry) -> None:
        """Queue ``entries`` for the next iteration, all at once (so they are prefilled together
        when there is room)."""
        with self.wake:
            if self.closed:
                raise RuntimeError("HFPolicy.submit called after close()")
            self.queue.extend(entries)
            self.wake.notify()

    def close(self) -> None:
        """Stop the loop; requests queued or running fail with "closed"."""
        with self.wake:
            self.closed = True
            self.wake.notify()
        if self.thread is not threading.current_thread():
            self.thread.join()

    # ----------------------------------------------------------------------------- the loop

    def _running(self) -> list[Entry]:
        return [e for source in (self.batch, self.slots) if source is not None for _, e in source.live()]

    def _serve(self) -> None:
        while True:
            with self.wake:
                while not self.queue and not self._running() and not self.closed:
                    self.wake.wait()
                if self.closed:
                    error = RuntimeError("the hf policy was closed before this request was answered")
                    for entry in [*self.queue, *self._running()]:
                        _settle(entry.future, error=error)
                    self.queue.clear()
                    return
                room = self.host.max_batch_size - len(self._running())
                newcomers = [self.queue.popleft() for _ in range(min(room, len(self.queue)))]
            newcomers = [e for e in newcomers if not e.future.cancelled()]
            try:
                with self.host.paused():
                    self._use_decode_threads()
                    self._version_read = False
                    if newcomers:
                        self._admit(newcomers)
                    if self.batch is not None:
                        self.batch = self._step(self.batch)
                    if self.slots is not None and self.slots.live():
                        self._step_slots(self.slots)
            except BaseException as exc:  # noqa: BLE001 - every waiting caller gets the error
                for entry in [*newcomers, *self._running()]:
                    _settle(entry.future, error=exc)
                self.batch = None
                if self.slots is not None:
                    self.slots.entries = [None] * len(self.slots.entries)
                    self.slots.mask.zero_()

    def _use_decode_threads(self) -> None:
        """Decode with the host's ``decode_threads`` from this step on (OpenMP keeps a count per
        thread: this one is the decode's alone)."""
        wanted = self.host.decode_threads
        if wanted is not None and wanted != self.threads:
            import torch

            torch.set_num_threads(wanted)
            self.threads = wanted

    def _say_once(self, message: str) -> None:
        if message not in self.said:
            self.said.add(message)
            log.warning(message)

    # ----------------------------------------------------------------------------- the prefix cache

    def _caching_calls(self) -> bool:
        """Whether ended rows' keys and values are kept (prefix caching on, a budget above 0)."""
        return self.host.prefix_caching and self.host.prefix_cache.budget_bytes > 0

    def _weights(self) -> Any:
        """The weights this iteration runs with, read when first needed in it (summing the
        parameters' version counters is not free): weights change only while the host's lock is
        free (:meth:`DecodeHost.paused`), so one read holds for the whole iteration. A change
        empties the prefix cache; rows prefilled before it neither lend their prefix nor are kept.
        ``None`` without prefix caching (nothing is shared, nothing to tell apart)."""
        if not self._version_read:
            self._version_read = True
            self._version = None
            if self.host.prefix_caching:
                self._version = self.host.weights_version()
                self.host.prefix_cache.sync(self._version)
        return self._version

    def _keep(self, entry: Entry, kv: list[tuple[Any, Any]]) -> None:
        """Keep an ended row's keys and values (its prompt and its tokens but the last) in the
        prefix cache, if every one of them was computed with the current weights."""
        ids = entry.row.prompt_ids + entry.tokens[:-1]
        if entry.version == self._weights() and kv and kv[0][0].shape[2] == len(ids):
            self.host.prefix_cache.put(ids, entry.row.adapter, kv)

    # ----------------------------------------------------------------------------- sampling

    def _sample(self, logits: Any, entries: list[Entry]) -> tuple[list[int], list[float]]:
        """Each entry's next token and logprob, each sampled with its own request's warpers."""
        import torch

        by_kind: dict[Sampling, list[int]] = {}
        for b, entry in enumerate(entries):
            by_kind.setdefault(entry.sampling, []).append(b)
        chosen, logprobs = [0] * len(entries), [0.0] * len(entries)
        for kind, members in by_kind.items():
            sampler = self.samplers.get(kind) or self.samplers.setdefault(kind, Sampler(kind))
            rows = logits if len(members) == len(entries) else logits[torch.tensor(members, device=logits.device)]
            tokens, lps = sampler(rows, [entries[b].generator for b in members])
            for b, token, lp in zip(members, tokens.tolist(), lps.tolist()):
                chosen[b], logprobs[b] = token, lp
        return chosen, logprobs

    def _advance(self, entries: list[Entry], logits: Any, kv: Any = None) -> tuple[list[int], list[int]]:
        """Sample, record, and resolve the rows that ended (kept in the prefix cache: ``kv(b)``
        gives each layer's keys and values of row ``b``'s cached tokens); returns the batch
        positions of the rows that go on and their tokens."""
        host = self.host
        chosen, logprobs = self._sample(logits, entries)
        keep = []
        for b, (entry, token, logprob) in enumerate(zip(entries, chosen, logprobs)):
            entry.tokens.append(token)
            entry.logprobs.append(logprob)
            end = ended(entry.row, entry.tokens, host.tokenizer, host.stop_token_ids)
            if end is not None:
                if kv is not None and entry.across_calls and self._caching_calls():
                    self._keep(entry, kv(b))
                _settle(entry.future, result=lambda e=entry, end=end: completion_of(
                    host.tokenizer, host.model, e.row.request, e.row.prompt_ids, e.tokens, e.logprobs, *end))
            elif not entry.future.cancelled():
                keep.append(b)
        return keep, [chosen[b] for b in keep]

    # ----------------------------------------------------------------------------- joining

    def _static(self) -> bool:
        """Whether joining rows go to the static cache (``decode`` is static or compiled, and the
        model is one it can serve)."""
        if self.mode == "dynamic":
            return False
        if getattr(self.host.hf_model, "peft_config", None):
            self._say_once("hf decode: the static KV cache does not serve PEFT models (per-row adapters); decoding with the dynamic one")
            return False
        return True

    def _admit(self, newcomers: list[Entry]) -> None:
        """Prefill ``newcomers`` and merge them into the running batch. A newcomer whose prompt
        shares at least :data:`~agentgym_lightning.policies.hf_kv.MIN_SHARED_PREFIX` tokens with
        a running row's (another episode's call with the same system prompt or schema) or with a
        kept call's (the prefix cache) takes that prefix's keys and values and computes only its
        rest; the others are prefilled together, sharing prefixes among themselves. Rows that do
        not keep keys and values across calls (``generate``'s) take no prefix from elsewhere and
        are prefilled apart: a batch's answers depend on the batch alone."""
        static = self._static()
        host = self.host
        version = self._weights()
        calls: list[Entry] = []
        batch: list[Entry] = []
        # Newcomers that ask the same (a group's episodes on one task, arriving together) are
        # prefilled once on a prefix from elsewhere, their rows copies of that one's.
        alike: dict[tuple[Any, ...], list[Entry]] = {}
        for entry in newcomers:
            entry.version = version
            if not entry.across_calls:
                batch.append(entry)
                continue
            self.counts.prompt_tokens += len(entry.row.prompt_ids)
            if not host.prefix_caching:
                calls.append(entry)
                continue
            alike.setdefault((entry.row.adapter, *entry.row.prompt_ids), []).append(entry)
        for same in alike.values():
            entry = same[0]
            running = self.slots if static else self.batch  # (as merged so far)
            donor = _best_donor(running, entry, version) if running is not None else None
            stored = host.prefix_cache.match(entry.row.prompt_ids, entry.row.adapter)
            if stored is not None and (donor is None or stored[1] > donor[1]):
                self._join(self._prefill_from(host.prefix_cache, same, *stored), static)
            elif donor is not None:
                self._join(self._prefill_from(running, same, *donor), static)
            else:
                calls.extend(same)
        for together in (calls, batch):
            if together:
                self._join(self._prefill(together), static)

    def _join(self, joining: Batch | None, static: bool) -> None:
        """Merge prefilled rows into the static cache (``static``) or the dynamic batch."""
        if joining is None:
            return
        if static and self.slots is None:
            try:
                self.slots = Slots(joining.cache, self.host.max_batch_size, self.host.static_cache_len)
            except Exception as exc:  # noqa: BLE001 - this transformers' cache API is not what we build on
                self.mode, static = "dynamic", False
                self._say_once(f"hf decode: no static KV cache with this model or transformers ({type(exc).__name__}: {exc}); "
                               "decoding with the dynamic one")
        if static:
            assert self.slots is not None
            rest = self.slots.place(joining)
            if not rest:
                return
            joining = next_batch([joining.entries[b] for b in rest], rest, [int(joining.feed[b, 0]) for b in rest],
                                 joining.positions - 1, joining.attention_mask[:, :-1], joining.cache, self.host.device)
        self.batch = merge(self.batch, joining)

    # ----------------------------------------------------------------------------- forward passes

    def _prefill_from(self, source: Any, entries: list[Entry], row: int, shared: int) -> Batch | None:
        """Prefill ``entries`` (calls with one prompt and adapter) on the keys and values of the
        first ``shared`` prompt tokens of ``row`` of ``source`` (a running batch, the slots, or the
        prefix cache: the same tokens, at the same positions): the prompt's rest is computed once,
        for one row, and each entry's row is a copy of its keys, values and logits."""
        import torch

        model, device = self.host.hf_model, self.host.device
        cache = new_cache(model)
        for i, (keys, values) in enumerate(source.prefix_kv(row, shared)):
            cache.update(keys, values, i)
        entry = entries[0]
        prompt = entry.row.prompt_ids
        attention_mask = torch.ones((1, len(prompt)), dtype=torch.long, device=device)
        positions = torch.arange(len(prompt), device=device)[None]
        with torch.inference_mode():
            logits = model(
                input_ids=torch.tensor([prompt[shared:]], device=device), attention_mask=attention_mask,
                position_ids=positions[:, shared:], **cache_kwarg(model, cache), use_cache=True, logits_to_keep=1,
                **adapter_kwarg(adapter_names(model, [entry.row])),
            ).logits[:, -1, :]
        self.counts.prefilled_tokens += len(prompt) - shared
        if len(entries) > 1:  # the same tokens, the same keys and values: copied, not computed again
            with torch.inference_mode():
                for layer in cache_layers(cache):
                    layer.keys, layer.values = (t.repeat(len(entries), 1, 1, 1) for t in (layer.keys, layer.values))
                attention_mask, positions, logits = (t.repeat(len(entries), 1) for t in (attention_mask, positions, logits))
        keep, tokens = self._advance(entries, logits, kv=lambda b: kv_of(cache_layers(cache), b, attention_mask[b]))
        if not keep:
            return None
        return next_batch([entries[b] for b in keep], keep, tokens, positions[:, -1:], attention_mask, cache, device)

    def _prefill(self, entries: list[Entry]) -> Batch | None:
        """Prefill ``entries`` together, their shared prompt prefixes computed once."""
        import torch

        model, device = self.host.hf_model, self.host.device
        rows = [e.row for e in entries]
        names = adapter_names(model, rows)
        prompts = [r.prompt_ids for r in rows]
        layout = prefix_layout(prompts, names) if self.host.prefix_caching else (0, [])
        input_ids, attention_mask, cache = prompt_inputs(model, rows, layout, pad_token_id=self.host.pad_token_id,
                                                         device=device, names=names)
        if entries[0].across_calls:  # (a prefill is all one kind: _admit keeps them apart)
            self.counts.prefilled_tokens += prefill_count(prompts, *layout)
        if cache is None:
            cache = new_cache(model)
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        cached = cache.get_seq_length()
        with torch.inference_mode():
            logits = model(
                input_ids=input_ids[:, cached:], attention_mask=attention_mask, position_ids=positions[:, cached:],
                **cache_kwarg(model, cache), use_cache=True, logits_to_keep=1, **adapter_kwarg(names),
            ).logits[:, -1, :]
        keep, tokens = self._advance(entries, logits, kv=lambda b: kv_of(cache_layers(cache), b, attention_mask[b]))
        if not keep:
            return None
        return next_batch([entries[b] for b in keep], keep, tokens, positions[:, -1:], attention_mask, cache, device)

    def _step(self, batch: Batch) -> Batch | None:
        """One decode step of the dynamic batch."""
        import torch

        model = self.host.hf_model
        with torch.inference_mode():
            logits = model(
                input_ids=batch.feed, attention_mask=batch.attention_mask, position_ids=batch.positions,
                **cache_kwarg(model, batch.cache), use_cache=True, logits_to_keep=1,
                **adapter_kwarg(adapter_names(model, [e.row for e in batch.entries])),
            ).logits[:, -1, :]
        keep, tokens = self._advance(batch.entries, logits, kv=lambda b: kv_of(cache_layers(batch.cache), b, batch.attention_mask[b]))
        if not keep:
            return None
        return next_batch(
            [batch.entries[b] for b in keep], keep, tokens, batch.positions, batch.attention_mask, batch.cache, self.host.device
        )

    def _step_slots(self, slots: Slots) -> None:
        """One decode step of every slot (free ones too: the shapes never change), then the
        running slots' tokens sampled."""
        import torch

        live = [slot for slot, _ in slots.live()]
        running = torch.zeros(len(slots.entries), dtype=torch.bool, device=slots.device)
        running[live] = True
        slots.mask[:, slots.t] = running
        attend = slots.mask.clone()
        attend[~running, 0] = True  # a free slot attends to something (no all-masked row: NaNs)
        bias = torch.zeros(attend.shape, dtype=slots.dtype, device=slots.device)
        bias.masked_fill_(~attend, torch.finfo(slots.dtype).min)
        slots.column.fill_(slots.t)
        with torch.inference_mode():
            logits = self._decode(input_ids=slots.feed, attention_mask=bias[:, None, None, :], position_ids=slots.positions,
                                  cache=slots.cache)
            logits = logits[torch.tensor(live, device=slots.device)]
        keep, tokens = self._advance([slots.entries[s] for s in live], logits, kv=lambda b: slots.ended_kv(live[b]))
        kept = [live[b] for b in keep]
        for slot in set(live) - set(kept):
            slots.entries[slot] = None
            slots.mask[slot] = False
        if kept:
            index = torch.tensor(kept, device=slots.device)
            slots.feed[index] = torch.tensor(tokens, device=slots.device)[:, None]
            slots.positions[index] += 1
        slots.t += 1

    def _decode(self, *, input_ids: Any, attention_mask: Any, position_ids: Any, cache: Any) -> Any:
        """The static decode step's last-token logits: compiled (``decode="compiled"``) or not.
        A compile that fails is said once and the step runs uncompiled from then on."""
        import torch

        model = self.host.hf_model
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
                  **cache_kwarg(model, cache), "use_cache": True, "logits_to_keep": 1}
        if self.mode == "compiled":
            try:
                if self.compiled is None or self.compiled[0] is not model:
                    self.compiled = (model, torch.compile(model, mode="reduce-overhead", fullgraph=False, dynamic=False))
                if input_ids.device.type == "cuda":
                    torch.compiler.cudagraph_mark_step_begin()
                return self.compiled[1](**inputs).logits[:, -1, :].clone()
            except Exception as exc:  # noqa: BLE001 - any compile failure: the same step, uncompiled
                self.mode = "static"
                self._say_once(f"hf decode: torch.compile of the decode step failed ({type(exc).__name__}: {exc}); "
                               "decoding with the static KV cache, uncompiled")
        return model(**inputs).logits[:, -1, :]


def _best_donor(source: Any, entry: Entry, version: Any = None) -> tuple[int, int] | None:
    """The running row of ``source`` (a batch or the slots) whose prompt shares the longest
    prefix with ``entry``'s (same adapter, prefilled with the weights of ``version``), and that
    prefix's length (leaving ``entry`` at least one token of its own); ``None`` when none shares
    :data:`~agentgym_lightning.policies.hf_kv.MIN_SHARED_PREFIX` tokens."""
    prompt = entry.row.prompt_ids
    best: tuple[int, int] | None = None
    for b, other in source.live():
        if other.row.adapter != entry.row.adapter or other.version != version:
            continue
        shared = min(common_prefix_length(prompt, other.row.prompt_ids), len(prompt) - 1)
        if shared >= MIN_SHARED_PREFIX and (best is None or shared > best[1]):
            best = (b, shared)
    return best


def _settle(future: Future[Completion], *, result: Any = None, error: BaseException | None = None) -> None:
    """Resolve ``future`` with ``result()`` (or ``error``), unless its caller cancelled it."""
    if future.cancelled():
        return
    if error is None:
        try:
            value = result()
        except BaseException as exc:  # noqa: BLE001 - decoding the answer failed: that is the answer
            error = exc
    if not future.set_running_or_notify_cancel():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)
