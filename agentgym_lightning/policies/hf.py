"""The ``hf`` backend: a transformers causal LM, decoded in batches, token-exact, CPU or GPU.

Decoding is a short loop of our own rather than ``model.generate``: a token per forward pass for
every row still running, and a row that ends (EOS, a stop string, its own ``max_tokens``) leaves
the batch and the KV cache at once, so the rows that ended early cost nothing while the longest
runs (``generate`` computes every row until the last one ends: on the main job's rollouts, about
half of all decoding). The loop is also what makes per-row sampling simple: each row's token is
drawn and recorded where it is chosen.

What a :class:`~agentgym_lightning.llm.Completion` from :class:`HFPolicy` holds:

* ``prompt_token_ids`` — the chat-template ids fed to the model for that request, without the
  left padding added for batching (see :func:`~agentgym_lightning.policies.chat.render_prompt_ids`).
* ``completion_token_ids`` — every token the model produced, up to and including the EOS token
  (``finish_reason == "stop"``), or the token that completed a stop string (``"stop"``; the text
  is cut before the stop string, as OpenAI and vLLM do, but the ids keep the token), or
  ``max_tokens`` tokens (``"length"``). Never padding.
* ``logprobs[i]`` — ``log p(completion_token_ids[i])`` under the distribution the token was drawn
  from: ``log_softmax(logits / temperature)`` after top-p filtering when sampling (so with
  ``temperature=1, top_p=1`` it is the model's plain ``log_softmax(logits)``), and the plain
  ``log_softmax(logits)`` of the raw fp32 logits for greedy decoding (``temperature == 0``).
  Computed from the fp32 logits of the very forward pass that produced the token, so a separate
  teacher-forced forward pass (:meth:`HFPolicy.score`) agrees to ~1e-5 in fp32.

Sampling parameters are honoured per request: requests with equal ``(temperature, top_p)``
share a batch (greedy requests all share one), and ``max_tokens`` and ``stop`` are applied per row,
so an agent asking for 16 tokens is not held to its neighbour's 256. A request with a ``seed``
draws its tokens from a generator of its own, seeded with it: it samples the same completion
whatever else shares its batch (the trainer relies on this to make runs reproducible). No ``top_k`` is
applied (OpenAI has none), and the model's own ``generation_config`` sampling defaults are
ignored: what the request says is what is sampled. ``n`` (one completion per request),
``tool_choice``, the presence/frequency penalties and ``logprobs``/``top_logprobs`` are ignored
(sampled-token logprobs are always returned).

**Per-step scheduling** (:meth:`HFPolicy.submit`). Besides ``generate`` (a batch in, its answers
out), the policy takes requests one at a time: each joins the running batch at the next decode
step and its future resolves the moment its row ends (:class:`_StepScheduler`; the driver uses
it whenever a policy has ``submit``). The completions are those ``generate`` gives the same
requests (seeded rows draw from their own generators). transformers' own continuous batching
(``generate_batch``) is not used: it samples every row from the global generator with one
``do_sample`` for all (no per-row seeded draws), and has no stop strings or per-row adapters.
``scheduling="batches"`` takes ``submit`` away (the batch mode before, for comparisons).

**Keys and values across calls** (``prefix_cache_mb``). A row that ends leaves its keys and values
in a :class:`~agentgym_lightning.policies.prefix_cache.PrefixCache` (least recently used out, within
the budget); a call whose prompt begins with one of them (the same episode's next call: its last
prompt and completion, then the tool's answer; another episode's system prompt) takes the longest
such prefix, from there or from a running row, and prefills only the rest. The cache is emptied
when the weights change (:meth:`HFPolicy.weights_version`), and a row prefilled before a change
neither lends its prefix nor is kept. :meth:`HFPolicy.prefill_stats` counts prompt tokens sent
and computed (the trainer logs them per step as ``generator/...``).

**The decode step** (``decode``). The per-step scheduler's running batch keeps its keys and values
in a dynamic cache (``"dynamic"``, the default: it grows and shrinks with the batch) or in
a static one of fixed shape, ``max_batch_size`` slots by ``static_cache_len`` columns
(:class:`_Slots`; ``"static"``), whose decode step has the same shapes every time, so it can be
compiled with CUDA graphs (``"compiled"``: ``torch.compile(mode="reduce-overhead")``; opt-in: for
agent rollouts on an H200 it was slower than the dynamic step). A joining row is prefilled dynamically and copied into a free slot; every step runs
all slots (free ones masked). The tokens are those of the dynamic cache (a test on CPU). What
cannot use it falls back, said once in the log: a PEFT model decodes dynamically, a failed
compile runs the static step uncompiled.

**Adapters** (``lora_per_agent``). When the model is a PEFT model holding several LoRA adapters, a
request naming one in ``metadata[ADAPTER_KEY]`` is generated with it (``"__base__"``: the base
model alone; no name: the active adapter). A batch mixing adapters is one batch, with
PEFT's per-row ``adapter_names`` (no split per adapter); prompt prefixes are shared only between
rows of the same adapter (an adapter changes the prefix's keys and values).
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from agentgym_lightning.cpu_threads import torch_threads
from agentgym_lightning.llm import ADAPTER_KEY, BASE_ADAPTER, ChatRequest, Completion, common_prefix_length
from agentgym_lightning.policies.base import Policy
from agentgym_lightning.policies.chat import decode_completion, render_prompt_ids, request_stop_token_ids, stop_token_ids
from agentgym_lightning.policies.models import DEFAULT_MODEL_NAME, resolve_model
from agentgym_lightning.policies.prefix_cache import DEFAULT_PREFIX_CACHE_MB, PrefixCache
from agentgym_lightning.policies.tool_calls import check_tool_prompt

__all__ = ["HFPolicy", "SCHEDULING", "DECODE"]

log = logging.getLogger(__name__)

#: ``HFPolicy(scheduling=...)``: calls joining the running decode, or batches decoded to their end.
SCHEDULING = ("per-step", "batches")
#: ``HFPolicy(decode=...)``: the per-step scheduler's decode step (see :class:`HFPolicy`).
DECODE = ("auto", "dynamic", "static", "compiled")


@dataclass
class _Row:
    """One request on its way through a batch."""

    index: int  # position in the caller's request list
    request: ChatRequest
    prompt_ids: list[int]
    max_tokens: int
    stops: tuple[str, ...]
    adapter: str | None = None  # the LoRA adapter it is generated with (None: the active one)
    stop_ids: frozenset[int] = frozenset()  # the request's own stop_token_ids, beside the policy's


@dataclass
class _Group:
    do_sample: bool
    temperature: float
    top_p: float
    rows: list[_Row] = field(default_factory=list)


#: Shared prefixes shorter than this are not worth a forward pass of their own.
_MIN_SHARED_PREFIX = 16


def _cacheable_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """The prefix all ``prompts`` share, less what leaves each at least one token of its own."""
    return min(common_prefix_length(*prompts), min(len(p) for p in prompts) - 1)


def _prefix_layout(prompts: Sequence[Sequence[int]], adapters: Sequence[str | None] | None = None) -> tuple[int, list[list[int]]]:
    """How a batch's prompts share prefixes: the length of the prefix all of them share, and the
    *prefix groups* (lists of row indices) of rows sharing at least :data:`_MIN_SHARED_PREFIX`
    more tokens (runs of neighbours in sorted order). Every row keeps at least one token outside
    both (the one whose logits start its completion); prefixes too short to pay for a forward
    pass of their own count as none. With ``adapters`` (one per row), only rows of the same
    adapter share a prefix: the batch-wide one needs a single adapter, a group one adapter each."""
    if len(prompts) < 2:
        return 0, []
    keys = list(adapters) if adapters is not None else [None] * len(prompts)
    shared = _cacheable_prefix(prompts) if len(set(keys)) == 1 else 0
    if shared < _MIN_SHARED_PREFIX:
        shared = 0
    order = sorted(range(len(prompts)), key=lambda b: (keys[b] or "", prompts[b]))
    runs: list[list[int]] = [[order[0]]]
    for before, b in zip(order, order[1:]):
        if keys[before] == keys[b] and common_prefix_length(prompts[before], prompts[b]) >= shared + _MIN_SHARED_PREFIX:
            runs[-1].append(b)
        else:
            runs.append([b])
    groups = []
    for run in runs:
        if len(run) > 1 and _cacheable_prefix([prompts[b] for b in run]) >= shared + _MIN_SHARED_PREFIX:
            groups.append(sorted(run))
    return shared, groups


def _prefill_count(prompts: Sequence[Sequence[int]], shared: int, groups: list[list[int]]) -> int:
    """Prompt tokens a prefill laid out as :func:`_prefix_layout` says computes: the batch prefix
    once, each prefix group's segment once, every row's rest."""
    ends = [shared] * len(prompts)
    total = shared
    for members in groups:
        end = _cacheable_prefix([prompts[b] for b in members])
        total += end - shared
        for b in members:
            ends[b] = end
    return total + sum(len(p) - end for p, end in zip(prompts, ends))


def _cache_kwarg(model: Any, cache: Any) -> dict[str, Any]:
    """``{name: cache}`` for ``model``'s forward: transformers renamed ``past_key_values`` to
    ``cache`` (the old name still works there, with a warning on every call). Read from the
    signature, not the version, so both kinds of transformers get the name they take."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # (a PEFT model passes it on)
    return {_cache_argument(type(base)): cache}


@functools.cache
def _cache_argument(model_class: type) -> str:
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


class HFPolicy(Policy):
    """Answers chat requests with a local transformers causal LM (default: embedded SmolLM2-135M).

    Args:
        model: an embedded model name (``smollm2-135m``), a local folder or a Hugging Face id;
            see :func:`~agentgym_lightning.policies.models.resolve_model`.
        device: ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"``, ``"cuda:1"``...
        dtype: ``"float32"`` (default; exact logprobs), ``"bfloat16"``, ``"float16"`` or ``"auto"``
            (float32 on CPU, bfloat16 on CUDA).
        max_batch_size: most rows decoded together in one batch.
        default_max_tokens: ``max_tokens`` for requests that give none.
        default_temperature: ``temperature`` for requests that give none (OpenAI's default is 1).
        seed: seeds torch once at start-up, for reproducible sampling of requests with no seed.
        num_threads: CPU threads for torch (``torch.set_num_threads``, process-wide); ``None``
            keeps torch's default. On a CPU shared with other busy processes, 1 is often faster:
            decoding is memory-bound and torch's threads spin-wait on each other.
        progress: print the one-line message when the embedded model is converted on first use.
        tool_prompt: how requests' ``tools`` are described to a model whose chat template has no
            tool support (SmolLM2's): ``"full"`` (Qwen2.5's wording with the JSON schemas) or
            ``"compact"`` (one sentence per tool, which small models follow far better; see
            :data:`~agentgym_lightning.policies.tool_calls.TOOL_PROMPTS`).
        prefix_caching: compute the prompt tokens every row of a batch shares (the G episodes of
            a task share their first prompt; agents share system prompts and examples) once per
            batch and reuse their keys and values, instead of once per row; and, with
            ``prefix_cache_mb``, across calls. The same completion tokens as without it; logprobs
            agree to fp32 rounding (~1e-6).
        prefix_cache_mb: megabytes of keys and values kept after calls end (the per-step
            scheduler's, :meth:`submit`), so that a later call beginning with the same tokens (the
            same episode's next call: its previous prompt and completion; another episode's system
            prompt and schema) prefills only the rest (:class:`~agentgym_lightning.policies.prefix_cache.PrefixCache`;
            least recently used out first; emptied when the weights change). ``0``: none kept.
        scheduling: ``"per-step"`` (default: the policy has :meth:`submit`, so a driver hands it
            each call as it comes and the call joins the running batch at the next decode step)
            or ``"batches"`` (no ``submit``: a driver gathers calls into batches and each batch is
            decoded to its end, the behaviour before per-step scheduling; for comparisons).
        decode: how the per-step scheduler's decode step runs. ``"dynamic"``: a KV cache that
            grows and shrinks with the batch (transformers' ``DynamicCache``). ``"static"``: a
            KV cache of fixed shape (``max_batch_size`` slots x ``static_cache_len`` columns,
            :class:`_SlotCache`), so every decode step has the same shapes. ``"compiled"``: the
            static cache with the decode step compiled (``torch.compile``, mode
            ``reduce-overhead``: CUDA graphs on a GPU). ``"auto"`` (default): ``"dynamic"``, on
            CUDA too: measured on an H200, the Spider step's rollout (16 agent episodes whose calls
            come and go) took 21.8 s dynamic and 29.5 s compiled, since the fixed shapes compute
            every slot, idle or not (docs/training.md); on CPU a step is compute-bound and the
            fixed shapes only add work. A model the static cache cannot serve (a PEFT model, a cache of other than
            plain layers) decodes dynamically, and a compile that fails falls back to the static
            cache uncompiled; each is said once in the log. Prefills are always dynamic; the
            batch path (:meth:`generate`) is always dynamic.
        static_cache_len: columns of the static cache (the longest prompt plus ``max_tokens`` a
            row may have there; a longer row decodes in a dynamic batch beside the static one).
        stop_tokens: tokens, named by their text, that end every completion as EOS does (kept
            in the ids, ``finish_reason`` ``"stop"``), e.g. ``["<|im_start|>"]``: a chat model
            that samples the next turn's opening token has finished its answer
            (:func:`~agentgym_lightning.policies.chat.stop_token_ids`). Default: EOS only.
    """

    backend = "hf"

    def __init__(
        self,
        model: str = DEFAULT_MODEL_NAME,
        *,
        device: str = "auto",
        dtype: str = "float32",
        max_batch_size: int = 32,
        default_max_tokens: int = 256,
        default_temperature: float = 1.0,
        seed: int | None = None,
        num_threads: int | None = None,
        progress: bool = True,
        tool_prompt: str = "full",
        prefix_caching: bool = True,
        prefix_cache_mb: float = DEFAULT_PREFIX_CACHE_MB,
        scheduling: str = "per-step",
        decode: str = "auto",
        static_cache_len: int = 4096,
        stop_tokens: Sequence[str] = (),
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if default_max_tokens < 1:
            raise ValueError(f"default_max_tokens must be >= 1, got {default_max_tokens}")
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        if scheduling not in SCHEDULING:
            raise ValueError(f"scheduling must be one of {SCHEDULING}, got {scheduling!r}")
        if decode not in DECODE:
            raise ValueError(f"decode must be one of {DECODE}, got {decode!r}")
        if static_cache_len < 2:
            raise ValueError(f"static_cache_len must be >= 2, got {static_cache_len}")
        if not prefix_cache_mb >= 0:  # (NaN too)
            raise ValueError(f"prefix_cache_mb must be >= 0 (0 keeps nothing), got {prefix_cache_mb}")
        self.tool_prompt = check_tool_prompt(tool_prompt)
        self.model = str(model)
        self.path = resolve_model(model, progress=progress)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if dtype == "auto":
            dtype = "bfloat16" if self.device.type == "cuda" else "float32"
        torch_dtype = getattr(torch, dtype, None)
        if not isinstance(torch_dtype, torch.dtype):
            raise ValueError(f"unknown dtype {dtype!r}; use float32, bfloat16, float16 or auto")
        self.dtype = torch_dtype
        self.max_batch_size = max_batch_size
        self.default_max_tokens = default_max_tokens
        self.default_temperature = default_temperature
        self.prefix_caching = prefix_caching
        #: Keys and values of calls that ended (used while ``prefix_caching`` is on).
        self.prefix_cache = PrefixCache(int(prefix_cache_mb * 2**20), min_shared=_MIN_SHARED_PREFIX)
        self._prompt_tokens = 0  # prompt tokens of the calls the per-step scheduler prefilled
        self._prefilled_tokens = 0  # of which computed (not taken from a cache or a running row)
        self.scheduling = scheduling
        #: The decode step the per-step scheduler starts with (``decode`` with ``"auto"`` resolved).
        self.decode = "dynamic" if decode == "auto" else decode
        self.static_cache_len = static_cache_len

        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        self.hf_model = AutoModelForCausalLM.from_pretrained(self.path, dtype=torch_dtype).to(self.device)
        self.hf_model.eval()

        eos = self.hf_model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            eos_ids.add(self.tokenizer.eos_token_id)
        if not eos_ids:
            raise ValueError(f"model {model!r} has no EOS token; cannot tell when an answer ends")
        self.eos_token_ids: frozenset[int] = frozenset(int(i) for i in eos_ids)
        pad = self.tokenizer.pad_token_id
        self.pad_token_id: int = int(pad if pad is not None else min(self.eos_token_ids))
        #: The ids that end a completion: EOS and ``stop_tokens``' (the generation config saved
        #: with checkpoints keeps the model's EOS only).
        self.stop_token_ids: frozenset[int] = self.eos_token_ids | stop_token_ids(self.tokenizer, stop_tokens)
        # A clean generation config (saved with checkpoints): a checkpoint's own sampling defaults
        # (top_k, repetition penalty...) would otherwise fill in what a request leaves unset for
        # whoever calls the saved model's ``generate``.
        self.hf_model.generation_config = GenerationConfig(
            bos_token_id=self.tokenizer.bos_token_id,
            eos_token_id=sorted(self.eos_token_ids),
            pad_token_id=self.pad_token_id,
        )
        self.max_positions: int | None = getattr(self.hf_model.config, "max_position_embeddings", None)
        if seed is not None:
            torch.manual_seed(seed)
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        #: torch threads the decode runs with (``None``: the process's). Asynchronous training sets
        #: it while an update runs beside the decode on the same CPU cores
        #: (:func:`~agentgym_lightning.cpu_threads.share_cores`); it applies from the next step.
        self.decode_threads: int | None = None
        self._lock = threading.Lock()
        self._scheduler_lock = threading.Lock()
        self._scheduler: _StepScheduler | None = None  # started by the first submit
        self._closed = False

    # ----------------------------------------------------------------------------- public

    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        """One :class:`Completion` per request, in order (see the module docstring for exactly
        what the ids and logprobs are). Thread-safe: concurrent callers are serialized."""
        if self._closed:
            raise RuntimeError("HFPolicy.generate called after close()")
        results: list[Completion | None] = [None] * len(requests)
        groups: dict[tuple[Any, ...], _Group] = {}
        for i, request in enumerate(requests):
            row, group_key, group = self._plan(i, request)
            if row.max_tokens <= 0:
                # The prompt fills the context window (or max_tokens was 0): nothing to generate.
                results[i] = self._finish(row, [], [], "length", None)
                continue
            groups.setdefault(group_key, group).rows.append(row)
        with self._lock, torch_threads(self.decode_threads):
            for group in groups.values():
                for row, completion in self._generate_group(group):
                    results[row.index] = completion
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]

    @property
    def submit(self) -> Any:  # a property: absent (AttributeError) under scheduling="batches"
        """:meth:`submit_request`, unless the policy was made with ``scheduling="batches"`` (then
        it has no ``submit`` and a driver batches its calls)."""
        if self.scheduling == "batches":
            raise AttributeError("HFPolicy(scheduling='batches') has no submit: it answers batches (generate)")
        return self.submit_request

    def submit_request(self, request: ChatRequest) -> Future[Completion]:
        """Answer ``request`` with iteration-level scheduling: it is prefilled (with the requests
        submitted alongside it, sharing their prompt prefixes) and joins the running batch at the
        next decode step; the future resolves the moment its row ends, whatever else still runs
        (see :class:`~agentgym_lightning.policies.base.SchedulingPolicy`). A seeded request gets the
        same completion as from :meth:`generate`; so does a greedy one, up to fp32 rounding of
        logits computed in another batch. A request that cannot be planned raises here;
        cancelling the future drops its row at the next step."""
        if self._closed:
            raise RuntimeError("HFPolicy.submit called after close()")
        row, _, group = self._plan(0, request)
        future: Future[Completion] = Future()
        if row.max_tokens <= 0:
            future.set_result(self._finish(row, [], [], "length", None))
            return future
        with self._scheduler_lock:
            if self._scheduler is None:
                self._scheduler = _StepScheduler(self)
        self._scheduler.put(_Entry(row, group, future, _row_generator(group, row, self.device)))
        return future

    def paused(self) -> threading.Lock:
        """A context in which no decode step runs (``generate`` and the step scheduler wait at
        their next step): the trainer copies new weights into :attr:`hf_model` inside it while
        episodes run (asynchronous training), so every step reads one version of them."""
        return self._lock

    def prefill_stats(self) -> dict[str, float]:
        """Counts since the policy started, of the calls :meth:`submit` answered: ``prompt_tokens``
        (their prompts' tokens), ``prefilled_tokens`` (those computed: not taken from another row's
        keys and values or the prefix cache), ``prefix_cache_hits`` (calls that took a prefix from
        the cache); and the cache now: ``prefix_cache_tokens``, ``prefix_cache_mb``."""
        cache = self.prefix_cache
        return {"prompt_tokens": float(self._prompt_tokens), "prefilled_tokens": float(self._prefilled_tokens),
                "prefix_cache_hits": float(cache.hits), "prefix_cache_tokens": float(cache.tokens),
                "prefix_cache_mb": cache.nbytes / 2**20}

    def weights_version(self) -> tuple[int, int]:
        """A value that changes whenever the model's weights do: the model object, and the sum of
        its parameters' version counters (torch bumps a tensor's on every in-place change: an
        optimizer step on a shared model, a weight copy into a generator of its own, an adapter
        loaded or merged). Keys and values computed under another version are never reused."""
        model = self.hf_model
        return id(model), sum(p._version for p in model.parameters())  # noqa: SLF001 - torch's version counter

    def score(self, prompt_ids: Sequence[int], completion_ids: Sequence[int], temperature: float = 1.0) -> list[float]:
        """Teacher-forced ``log_softmax(logits / temperature)`` of each completion token given
        everything before it: one plain forward pass over prompt+completion (no cache, no
        padding). What a trainer recomputes; the tests compare it with :meth:`generate`."""
        import torch

        if not completion_ids:
            return []
        ids = torch.tensor([list(prompt_ids) + list(completion_ids)], device=self.device)
        with torch.inference_mode():
            logits = self.hf_model(input_ids=ids).logits[0].float()
        # Position t predicts token t+1: the completion's tokens are predicted from len(prompt)-1 on.
        start = len(prompt_ids) - 1
        pred = logits[start : start + len(completion_ids)]
        if temperature not in (0, 1):
            pred = pred / temperature
        lp = torch.log_softmax(pred, dim=-1)
        target = torch.tensor(list(completion_ids), device=self.device)
        return lp.gather(1, target[:, None]).squeeze(1).tolist()

    def close(self) -> None:
        """Drop the model (frees its memory once nothing else holds it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._scheduler is not None:
            self._scheduler.close()  # running requests fail with "closed"
        self.hf_model = None  # type: ignore[assignment]
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:  # pragma: no cover - torch was imported in __init__
            pass

    # ----------------------------------------------------------------------------- internals

    def _plan(self, index: int, request: ChatRequest) -> tuple[_Row, tuple[Any, ...], _Group]:
        s = request.sampling
        temperature = self.default_temperature if s.temperature is None else float(s.temperature)
        top_p = 1.0 if s.top_p is None else float(s.top_p)
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        prompt_ids = render_prompt_ids(self.tokenizer, request, self.tool_prompt)
        max_tokens = self.default_max_tokens if s.max_tokens is None else int(s.max_tokens)
        if self.max_positions is not None:
            max_tokens = min(max_tokens, self.max_positions - len(prompt_ids))
        stops = tuple(x for x in (s.stop or []) if x)
        adapter = request.metadata.get(ADAPTER_KEY)
        if adapter is not None and adapter != BASE_ADAPTER and adapter not in (getattr(self.hf_model, "peft_config", None) or {}):
            raise ValueError(
                f"the request asks for the LoRA adapter {adapter!r}, which the model does not hold "
                f"(it has {sorted(getattr(self.hf_model, 'peft_config', None) or {}) or 'none'}): name one of those in "
                f"metadata[{ADAPTER_KEY!r}], or leave it out to use the model as it is"
            )
        row = _Row(index=index, request=request, prompt_ids=prompt_ids, max_tokens=max_tokens, stops=stops, adapter=adapter,
                   stop_ids=request_stop_token_ids(request, len(self.tokenizer)))
        do_sample = temperature > 0
        if not do_sample:
            # Greedy ignores temperature/top_p/seed: every greedy request can share one batch.
            return row, (False,), _Group(False, 0.0, 1.0)
        key = (True, temperature, top_p)
        return row, key, _Group(True, temperature, top_p)

    def _generate_group(self, group: _Group) -> list[tuple[_Row, Completion]]:
        rows = sorted(group.rows, key=lambda r: len(r.prompt_ids))  # less padding per batch
        out: list[tuple[_Row, Completion]] = []
        for start in range(0, len(rows), self.max_batch_size):
            out.extend(self._generate_batch(group, rows[start : start + self.max_batch_size]))
        return out

    def _generate_batch(self, group: _Group, rows: list[_Row]) -> list[tuple[_Row, Completion]]:
        """Decode ``rows`` together, a token per forward pass, dropping each row from the batch
        (and its keys and values from the cache) the moment it ends: rows that ended early cost
        nothing while the longest one runs (``generate`` would keep computing them until the
        last row ends; on the main job's batches that was half the decoding)."""
        import torch
        from transformers import DynamicCache

        adapter_names = self._adapter_names(rows)
        input_ids, attention_mask, cache = self._prompt_inputs(rows, adapter_names)
        if cache is None:
            cache = DynamicCache(config=self.hf_model.config)
        sampler = _Sampler(group.do_sample, group.temperature, group.top_p)
        generators = [_row_generator(group, row, self.device) for row in rows]
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        cached = cache.get_seq_length()
        feed, feed_positions = input_ids[:, cached:], positions[:, cached:]
        alive = list(range(len(rows)))  # batch position -> row
        tokens: list[list[int]] = [[] for _ in rows]
        logprobs: list[list[float]] = [[] for _ in rows]
        out: list[tuple[_Row, Completion]] = []
        with torch.inference_mode():
            while alive:
                logits = self.hf_model(
                    input_ids=feed, attention_mask=attention_mask, position_ids=feed_positions, **_cache_kwarg(self.hf_model, cache),
                    use_cache=True, logits_to_keep=1,
                    **({} if adapter_names is None else {"adapter_names": [adapter_names[i] for i in alive]}),
                ).logits[:, -1, :]
                chosen, chosen_logprobs = sampler(logits, [generators[i] for i in alive])
                keep = []
                for b, (i, token, logprob) in enumerate(zip(alive, chosen.tolist(), chosen_logprobs.tolist())):
                    tokens[i].append(token)
                    logprobs[i].append(logprob)
                    ended = self._ended(rows[i], tokens[i])
                    if ended is None:
                        keep.append(b)
                    else:
                        out.append((rows[i], self._finish(rows[i], tokens[i], logprobs[i], *ended)))
                if len(keep) < len(alive):
                    if not keep:
                        break
                    index = torch.tensor(keep, device=self.device)
                    cache.batch_select_indices(index)
                    attention_mask, chosen, feed_positions = attention_mask[index], chosen[index], feed_positions[index]
                    alive = [alive[b] for b in keep]
                attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(alive), 1))], dim=1)
                feed, feed_positions = chosen[:, None], feed_positions[:, -1:] + 1
        return out

    def _ended(self, row: _Row, tokens: list[int]) -> tuple[str, str | None] | None:
        """``(finish_reason, text)`` once ``row`` has ended with its last token (``text``: the
        answer cut before a stop string; ``None`` to decode the ids), else ``None``."""
        if tokens[-1] in self.stop_token_ids or tokens[-1] in row.stop_ids:
            return "stop", None
        if row.stops:
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            found = [text.find(s) for s in row.stops if s in text]
            if found:
                return "stop", text[: min(found)]
        if len(tokens) >= row.max_tokens:
            return "length", None
        return None

    def _adapter_names(self, rows: list[_Row]) -> list[str] | None:
        """PEFT's ``adapter_names`` for the batch (one per row), or ``None`` when every row runs
        on the active adapter (the plain forward: nothing to route)."""
        if all(r.adapter is None for r in rows) or not getattr(self.hf_model, "peft_config", None):
            return None  # (a model without adapters is the base model: _plan refused any other name)
        active = getattr(self.hf_model, "active_adapter", None)
        names = [r.adapter or active or BASE_ADAPTER for r in rows]
        return None if all(n == active for n in names) else names

    def _prompt_inputs(self, rows: list[_Row], adapter_names: list[str] | None = None) -> tuple[Any, Any, Any]:
        """The batch's ``input_ids`` and ``attention_mask`` and, with prefix caching, the KV cache
        of the prompts' shared prefixes (else ``None``).

        Without prefix caching the rows are left-padded. With it, prompts are laid out in three
        segments, each padded on its left: the prefix every row shares (a system prompt), the
        prefix a row shares with others in its *prefix group* (the G episodes of a task sending
        the same first prompt), and the row's own rest. The first two are computed once each
        (the batch prefix with batch 1, then each group's segment with one row per group, on
        top of it) and their keys and values copied to the rows; decoding then runs only the
        rests. Padding is masked out and position ids count unmasked tokens only (transformers
        derives them from the mask), so every row sees exactly its own prompt at its own
        positions, as with left padding. Every row keeps at least one token outside the cache:
        the logits of the first completion token come from that forward pass. With
        ``adapter_names``, prefixes are shared within an adapter's rows only, and computed with it.
        """
        import torch

        prompts = [r.prompt_ids for r in rows]
        shared, groups = _prefix_layout(prompts, adapter_names) if self.prefix_caching else (0, [])
        group_of = [0] * len(rows)  # group 0: rows in no group (an empty segment)
        ends = [shared]
        for g, members in enumerate(groups, start=1):
            for b in members:
                group_of[b] = g
            ends.append(_cacheable_prefix([prompts[b] for b in members]))
        group_width = max(end - shared for end in ends)
        rest_width = max(len(p) - ends[group_of[b]] for b, p in enumerate(prompts))
        width = shared + group_width + rest_width
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for b, p in enumerate(prompts):
            end = ends[group_of[b]]
            for stop, tokens in ((shared, p[:shared]), (shared + group_width, p[shared:end]), (width, p[end:])):
                if tokens:  # right-aligned in its segment, which ends at `stop`
                    input_ids[b, stop - len(tokens) : stop] = torch.tensor(tokens)
                    attention_mask[b, stop - len(tokens) : stop] = 1
        input_ids = input_ids.to(self.device)
        attention_mask = attention_mask.to(self.device)
        if not shared and not groups:
            return input_ids, attention_mask, None
        from transformers import DynamicCache

        cache = DynamicCache(config=self.hf_model.config)
        with torch.inference_mode():
            # logits_to_keep=1: the prefixes' own logits are never used; skip most of the LM head.
            if shared:
                self.hf_model(
                    input_ids=input_ids[:1, :shared], **_cache_kwarg(self.hf_model, cache), use_cache=True, logits_to_keep=1,
                    **({} if adapter_names is None else {"adapter_names": adapter_names[:1]}),
                )
            if groups:
                used = sorted(set(group_of))  # group 0 only if some row is in no group
                first = [group_of.index(g) for g in used]  # one row of each: its segment stands for all
                cache.batch_repeat_interleave(len(used))
                mask = attention_mask[first, : shared + group_width]
                positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, shared:]
                self.hf_model(
                    input_ids=input_ids[first, shared : shared + group_width], attention_mask=mask,
                    position_ids=positions, **_cache_kwarg(self.hf_model, cache), use_cache=True, logits_to_keep=1,
                    **({} if adapter_names is None else {"adapter_names": [adapter_names[b] for b in first]}),
                )
                cache.batch_select_indices(torch.tensor([used.index(g) for g in group_of], device=self.device))
            else:
                cache.batch_repeat_interleave(len(rows))
        return input_ids, attention_mask, cache

    def _finish(self, row: _Row, ids: list[int], logprobs: list[float], reason: str, text: str | None) -> Completion:
        return decode_completion(
            self.tokenizer,
            row.prompt_ids,
            ids,
            logprobs,
            reason,
            text=text,
            parse_tools=bool(row.request.tools),
            model=self.model,
        ).completion



@dataclass
class _Entry:
    """A submitted request in the step scheduler: its row, its sampling and its future."""

    row: _Row
    group: _Group
    future: Future[Completion]
    generator: Any = None  # the row's own torch generator (seeded, sampled rows)
    version: Any = None  # the weights it was prefilled with (HFPolicy.weights_version)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


@dataclass
class _Batch:
    """The running batch, ready for its next forward pass: ``feed`` (one token per row),
    ``positions`` (each row's), ``attention_mask`` (the cached columns, then the fed token's)
    and the KV ``cache`` of every row, each row's tokens right-aligned."""

    entries: list[_Entry]
    feed: Any
    positions: Any
    attention_mask: Any
    cache: Any

    def live(self) -> list[tuple[int, _Entry]]:
        """``(row, entry)`` of every running row."""
        return list(enumerate(self.entries))

    def prefix_kv(self, row: int, shared: int) -> list[tuple[Any, Any]]:
        """Each layer's keys and values of the first ``shared`` cached tokens of ``row``."""
        columns = self.attention_mask[row, :-1].nonzero().squeeze(1)[:shared]  # (the last column: the fed token)
        return [(layer.keys[row : row + 1, :, columns], layer.values[row : row + 1, :, columns]) for layer in _cache_layers(self.cache)]


class _Slots:
    """The static KV cache of the per-step scheduler (``decode="static"``/``"compiled"``): a fixed
    number of slots (rows) by a fixed number of columns, so every decode step has the same shapes
    (what CUDA graphs need). Every running row's tokens end at column ``t`` (the fed token's keys
    and values are written there, in every slot); a row that joins is copied into a free slot,
    right-aligned; a row that ends frees its slot. ``mask`` marks each slot's cached columns.
    The columns no row uses any more are dropped (everything shifted left) when a row joins."""

    def __init__(self, template: Any, slots: int, columns: int) -> None:
        import torch

        layers = _cache_layers(template)
        self.device, self.dtype = layers[0].keys.device, layers[0].keys.dtype
        self.column = torch.zeros(1, dtype=torch.long, device=self.device)
        layer_class = _slot_layer_class()
        self.layers = [
            layer_class(
                layer.keys.new_zeros((slots, layer.keys.shape[1], columns, layer.keys.shape[3])),
                layer.values.new_zeros((slots, layer.values.shape[1], columns, layer.values.shape[3])),
                self.column,
            )
            for layer in layers
        ]
        self.cache = _slot_cache_class()(self.layers)
        self.entries: list[_Entry | None] = [None] * slots
        self.mask = torch.zeros((slots, columns), dtype=torch.bool, device=self.device)
        self.feed = torch.zeros((slots, 1), dtype=torch.long, device=self.device)
        self.positions = torch.zeros((slots, 1), dtype=torch.long, device=self.device)
        self.t = 0  # the column the next step writes

    @property
    def columns(self) -> int:
        return self.mask.shape[1]

    def live(self) -> list[tuple[int, _Entry]]:
        return [(slot, entry) for slot, entry in enumerate(self.entries) if entry is not None]

    def prefix_kv(self, slot: int, shared: int) -> list[tuple[Any, Any]]:
        columns = self.mask[slot, : self.t].nonzero().squeeze(1)[:shared]
        return [(layer.keys[slot : slot + 1, :, columns], layer.values[slot : slot + 1, :, columns]) for layer in self.layers]

    def row_kv(self, slot: int) -> list[tuple[Any, Any]]:
        """Each layer's keys and values of every cached token of ``slot``, the one just fed too."""
        columns = self.mask[slot, : self.t + 1].nonzero().squeeze(1)
        return [(layer.keys[slot : slot + 1, :, columns], layer.values[slot : slot + 1, :, columns]) for layer in self.layers]

    def place(self, joining: _Batch) -> list[int]:
        """Copy the rows of ``joining`` (a prefilled batch) into free slots; returns the rows that
        did not fit (too long for the columns left, or no free slot), for a dynamic batch."""
        import torch

        width = joining.attention_mask.shape[1] - 1  # its cached columns (the last: the fed token's)
        live = self.live()
        used = self.mask[:, : self.t].any(0).nonzero()
        self._shift(-(int(used[0]) if len(used) else self.t))  # drop the columns no row uses
        free = [slot for slot, entry in enumerate(self.entries) if entry is None]
        left = [_remaining(e) for _, e in live]
        rows, rest = [], []
        for b, entry in enumerate(joining.entries):
            if free and max(self.t, width) + max([*left, _remaining(entry)]) <= self.columns:
                rows.append((b, free.pop(0)))
                left.append(_remaining(entry))
            else:
                rest.append(b)
        if not rows:
            return rest
        self._shift(max(0, width - self.t))  # room on the left for its prompt
        start = self.t - width
        source = _cache_layers(joining.cache)
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


def _remaining(entry: _Entry) -> int:
    """Tokens ``entry`` may still sample (each takes one decode step, one column)."""
    return entry.row.max_tokens - len(entry.tokens)


@functools.cache
def _slot_layer_class() -> type:
    """The KV cache layer of :class:`_Slots` (made on first use: transformers loads lazily here)."""
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
def _slot_cache_class() -> type:
    from transformers.cache_utils import Cache

    class SlotCache(Cache):
        """A cache of :func:`_slot_layer_class` layers."""

        def __init__(self, layers: list[Any]) -> None:
            super().__init__(layers=layers)

    return SlotCache


class _StepScheduler:
    """Iteration-level scheduling for :class:`HFPolicy` (see :meth:`HFPolicy.submit`).

    One thread runs the loop: take the requests submitted since the last step (as many as fit in
    ``max_batch_size``), prefill them (:meth:`_admit`: on a running row's prefix when one shares
    it, else together with the batch path's prefix layout, so the G first prompts of a task that
    arrive together compute their shared prefix once), sample their first tokens, and merge them
    into the running batch; then one decode step for every running row. A row that ends leaves
    the batch at once and its future is resolved. Rows of different ``(temperature, top_p)``
    share the batch: each is sampled with its own warpers, a seeded row from its own generator,
    so its tokens do not depend on its batch-mates. Each prefill and each step holds the
    policy's lock, so ``generate`` calls interleave.

    The running batch is dynamic (``decode="dynamic"``: its KV cache and mask left-padded to a
    common width when rows join, the leading columns no row needs cropped) or static
    (:class:`_Slots`, ``decode="static"``/``"compiled"``), with a dynamic batch beside it for the
    rows too long for its columns."""

    def __init__(self, policy: HFPolicy) -> None:
        self.policy = policy
        self.queue: deque[_Entry] = deque()
        self.wake = threading.Condition()
        self.closed = False
        self.samplers: dict[tuple[bool, float, float], _Sampler] = {}
        self.mode = policy.decode
        self.batch: _Batch | None = None  # the dynamic batch
        self.slots: _Slots | None = None  # the static one (made on first use)
        self.compiled: tuple[Any, Any] | None = None  # (model, its compiled forward)
        self.said: set[str] = set()
        self.threads: int | None = None  # the decode_threads this thread last set
        self.version: Any = None  # the weights this step runs with (read once a step, under the policy's lock)
        self.thread = threading.Thread(target=self._serve, name="hf-step-scheduler", daemon=True)
        self.thread.start()

    def put(self, entry: _Entry) -> None:
        with self.wake:
            if self.closed:
                raise RuntimeError("HFPolicy.submit called after close()")
            self.queue.append(entry)
            self.wake.notify()

    def close(self) -> None:
        with self.wake:
            self.closed = True
            self.wake.notify()
        if self.thread is not threading.current_thread():
            self.thread.join()

    def _running(self) -> list[_Entry]:
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
                room = self.policy.max_batch_size - len(self._running())
                newcomers = [self.queue.popleft() for _ in range(min(room, len(self.queue)))]
            newcomers = [e for e in newcomers if not e.future.cancelled()]
            try:
                with self.policy._lock:  # noqa: SLF001 - the policy's own scheduler
                    self._use_decode_threads()
                    self._read_version()
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
        """Decode with the policy's ``decode_threads`` from this step on (OpenMP keeps a count
        per thread: this one is the decode's alone)."""
        wanted = self.policy.decode_threads
        if wanted is not None and wanted != self.threads:
            import torch

            torch.set_num_threads(wanted)
            self.threads = wanted

    def _caching_calls(self) -> bool:
        """Whether ended rows' keys and values are kept (prefix caching on, a budget above 0)."""
        return self.policy.prefix_caching and self.policy.prefix_cache.budget_bytes > 0

    def _read_version(self) -> None:
        """The weights this step runs with: weights change only while the policy's lock is free
        (:meth:`HFPolicy.paused`), so one read a step holds for all of it. A change empties the
        prefix cache; rows prefilled before it neither lend their prefix nor are kept."""
        if self.policy.prefix_caching:
            self.version = self.policy.weights_version()
            self.policy.prefix_cache.sync(self.version)

    def _keep(self, entry: _Entry, kv: list[tuple[Any, Any]]) -> None:
        """Keep an ended row's keys and values (its prompt and its tokens but the last) in the
        prefix cache, if every one of them was computed with the current weights."""
        ids = entry.row.prompt_ids + entry.tokens[:-1]
        if entry.version == self.version and kv and kv[0][0].shape[2] == len(ids):
            self.policy.prefix_cache.put(ids, entry.row.adapter, kv)

    def _say_once(self, message: str) -> None:
        if message not in self.said:
            self.said.add(message)
            log.warning(message)

    def _static(self) -> bool:
        """Whether joining rows go to the static cache (``decode`` is static or compiled, and the
        model is one it can serve)."""
        if self.mode == "dynamic":
            return False
        if getattr(self.policy.hf_model, "peft_config", None):
            self._say_once("hf decode: the static KV cache does not serve PEFT models (per-row adapters); decoding with the dynamic one")
            return False
        return True

    def _sample(self, logits: Any, entries: list[_Entry]) -> tuple[list[int], list[float]]:
        """Each entry's next token and logprob, each sampled with its own request's warpers."""
        import torch

        by_kind: dict[tuple[bool, float, float], list[int]] = {}
        for b, entry in enumerate(entries):
            g = entry.group
            by_kind.setdefault((g.do_sample, g.temperature, g.top_p), []).append(b)
        chosen, logprobs = [0] * len(entries), [0.0] * len(entries)
        for kind, members in by_kind.items():
            sampler = self.samplers.get(kind) or self.samplers.setdefault(kind, _Sampler(*kind))
            rows = logits if len(members) == len(entries) else logits[torch.tensor(members, device=logits.device)]
            tokens, lps = sampler(rows, [entries[b].generator for b in members])
            for b, token, lp in zip(members, tokens.tolist(), lps.tolist()):
                chosen[b], logprobs[b] = token, lp
        return chosen, logprobs

    def _advance(self, entries: list[_Entry], logits: Any, kv: Any = None) -> tuple[list[int], list[int]]:
        """Sample, record, and resolve the rows that ended (kept in the prefix cache: ``kv(b)``
        gives each layer's keys and values of row ``b``'s cached tokens); returns the batch
        positions of the rows that go on and their tokens."""
        chosen, logprobs = self._sample(logits, entries)
        keep = []
        for b, (entry, token, logprob) in enumerate(zip(entries, chosen, logprobs)):
            entry.tokens.append(token)
            entry.logprobs.append(logprob)
            ended = self.policy._ended(entry.row, entry.tokens)  # noqa: SLF001
            if ended is not None:
                if kv is not None and self._caching_calls():
                    self._keep(entry, kv(b))
                _settle(entry.future, result=lambda e=entry, end=ended: self.policy._finish(e.row, e.tokens, e.logprobs, *end))  # noqa: SLF001
            elif not entry.future.cancelled():
                keep.append(b)
        return keep, [chosen[b] for b in keep]

    def _admit(self, newcomers: list[_Entry]) -> None:
        """Prefill ``newcomers`` and merge them into the running batch. A newcomer whose prompt
        shares at least :data:`_MIN_SHARED_PREFIX` tokens with a running row's (another episode's
        call with the same system prompt or schema) takes that prefix's keys and values from the
        row and computes only its rest; the others are prefilled together, sharing prefixes among
        themselves (the batch path's layout)."""
        static = self._static()
        together: list[_Entry] = []
        policy = self.policy
        for entry in newcomers:
            entry.version = self.version
            policy._prompt_tokens += len(entry.row.prompt_ids)  # noqa: SLF001 - the policy's own counters
            if not policy.prefix_caching:
                together.append(entry)
                continue
            running = self.slots if static else self.batch  # (as merged so far)
            donor = _best_donor(running, entry, self.version) if running is not None else None
            stored = policy.prefix_cache.match(entry.row.prompt_ids, entry.row.adapter)
            if stored is not None and (donor is None or stored[1] > donor[1]):
                self._join(self._prefill_from(policy.prefix_cache, entry, *stored), static)
            elif donor is not None:
                self._join(self._prefill_from(running, entry, *donor), static)
            else:
                together.append(entry)
        if together:
            self._join(self._prefill(together), static)

    def _join(self, joining: _Batch | None, static: bool) -> None:
        """Merge prefilled rows into the static cache (``static``) or the dynamic batch."""
        if joining is None:
            return
        if static and self.slots is None:
            try:
                self.slots = _Slots(joining.cache, self.policy.max_batch_size, self.policy.static_cache_len)
            except Exception as exc:  # noqa: BLE001 - this transformers' cache API is not what we build on
                self.mode, static = "dynamic", False
                self._say_once(f"hf decode: no static KV cache with this model or transformers ({type(exc).__name__}: {exc}); "
                               "decoding with the dynamic one")
        if static:
            assert self.slots is not None
            rest = self.slots.place(joining)
            if not rest:
                return
            joining = _next_batch([joining.entries[b] for b in rest], rest, [int(joining.feed[b, 0]) for b in rest],
                                  joining.positions - 1, joining.attention_mask[:, :-1], joining.cache, self.policy.device)
        self.batch = _merge(self.batch, joining)

    def _prefill_from(self, source: Any, entry: _Entry, row: int, shared: int) -> _Batch | None:
        """Prefill ``entry`` alone on the keys and values of the first ``shared`` prompt tokens of
        the running ``row`` of ``source`` (the same tokens, at the same positions)."""
        import torch
        from transformers import DynamicCache

        policy = self.policy
        cache = DynamicCache(config=policy.hf_model.config)
        for i, (keys, values) in enumerate(source.prefix_kv(row, shared)):
            cache.update(keys, values, i)
        prompt = entry.row.prompt_ids
        attention_mask = torch.ones((1, len(prompt)), dtype=torch.long, device=policy.device)
        positions = torch.arange(len(prompt), device=policy.device)[None]
        adapter_names = policy._adapter_names([entry.row])  # noqa: SLF001
        with torch.inference_mode():
            logits = policy.hf_model(
                input_ids=torch.tensor([prompt[shared:]], device=policy.device), attention_mask=attention_mask,
                position_ids=positions[:, shared:], **_cache_kwarg(policy.hf_model, cache), use_cache=True, logits_to_keep=1,
                **({} if adapter_names is None else {"adapter_names": adapter_names}),
            ).logits[:, -1, :]
        policy._prefilled_tokens += len(prompt) - shared  # noqa: SLF001
        keep, tokens = self._advance([entry], logits, kv=lambda b: [(layer.keys, layer.values) for layer in _cache_layers(cache)])
        if not keep:
            return None
        return _next_batch([entry], keep, tokens, positions[:, -1:], attention_mask, cache, policy.device)

    def _prefill(self, entries: list[_Entry]) -> _Batch | None:
        import torch
        from transformers import DynamicCache

        policy = self.policy
        rows = [e.row for e in entries]
        adapter_names = policy._adapter_names(rows)  # noqa: SLF001
        input_ids, attention_mask, cache = policy._prompt_inputs(rows, adapter_names)  # noqa: SLF001
        prompts = [r.prompt_ids for r in rows]
        policy._prefilled_tokens += _prefill_count(prompts, *(_prefix_layout(prompts, adapter_names) if policy.prefix_caching else (0, [])))  # noqa: SLF001
        if cache is None:
            cache = DynamicCache(config=policy.hf_model.config)
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        cached = cache.get_seq_length()
        with torch.inference_mode():
            logits = policy.hf_model(
                input_ids=input_ids[:, cached:], attention_mask=attention_mask, position_ids=positions[:, cached:],
                **_cache_kwarg(policy.hf_model, cache), use_cache=True, logits_to_keep=1,
                **({} if adapter_names is None else {"adapter_names": adapter_names}),
            ).logits[:, -1, :]
        keep, tokens = self._advance(entries, logits, kv=functools.partial(_row_kv, cache, attention_mask))
        if not keep:
            return None
        return _next_batch([entries[b] for b in keep], keep, tokens, positions[:, -1:], attention_mask, cache, policy.device)

    def _step(self, batch: _Batch) -> _Batch | None:
        import torch

        policy = self.policy
        adapter_names = policy._adapter_names([e.row for e in batch.entries])  # noqa: SLF001
        with torch.inference_mode():
            logits = policy.hf_model(
                input_ids=batch.feed, attention_mask=batch.attention_mask, position_ids=batch.positions,
                **_cache_kwarg(policy.hf_model, batch.cache), use_cache=True, logits_to_keep=1,
                **({} if adapter_names is None else {"adapter_names": adapter_names}),
            ).logits[:, -1, :]
        keep, tokens = self._advance(batch.entries, logits, kv=functools.partial(_row_kv, batch.cache, batch.attention_mask))
        if not keep:
            return None
        return _next_batch(
            [batch.entries[b] for b in keep], keep, tokens, batch.positions, batch.attention_mask, batch.cache, policy.device
        )

    def _step_slots(self, slots: _Slots) -> None:
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
        keep, tokens = self._advance([slots.entries[s] for s in live], logits, kv=lambda b: slots.row_kv(live[b]))
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

        model = self.policy.hf_model
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
                  **_cache_kwarg(model, cache), "use_cache": True, "logits_to_keep": 1}
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


def _best_donor(source: Any, entry: _Entry, version: Any = None) -> tuple[int, int] | None:
    """The running row of ``source`` (a batch or the slots) whose prompt shares the longest
    prefix with ``entry``'s (same adapter, prefilled with the weights of ``version``), and that
    prefix's length (leaving ``entry`` at least one token of its own); ``None`` when none shares
    :data:`_MIN_SHARED_PREFIX` tokens."""
    prompt = entry.row.prompt_ids
    best: tuple[int, int] | None = None
    for b, other in source.live():
        if other.row.adapter != entry.row.adapter or other.version != version:
            continue
        shared = min(common_prefix_length(prompt, other.row.prompt_ids), len(prompt) - 1)
        if shared >= _MIN_SHARED_PREFIX and (best is None or shared > best[1]):
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


def _next_batch(entries: list[_Entry], keep: list[int], tokens: list[int], positions: Any, attention_mask: Any,
                cache: Any, device: Any) -> _Batch:
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
        _crop_left(cache, first)
    attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(keep), 1))], dim=1)
    return _Batch(entries, torch.tensor(tokens, device=device)[:, None], positions + 1, attention_mask, cache)


def _row_kv(cache: Any, attention_mask: Any, row: int) -> list[tuple[Any, Any]]:
    """Each layer's keys and values of the tokens ``row`` attends to, after the forward pass
    whose mask is ``attention_mask`` (the fed tokens' are in the cache then)."""
    columns = attention_mask[row].nonzero().squeeze(1)
    return [(layer.keys[row : row + 1, :, columns], layer.values[row : row + 1, :, columns]) for layer in _cache_layers(cache)]


def _cache_layers(cache: Any) -> list[Any]:
    from transformers.cache_utils import DynamicLayer

    layers = cache.layers
    for layer in layers:
        if type(layer) is not DynamicLayer:
            raise NotImplementedError(
                f"per-step scheduling (HFPolicy.submit) joins KV caches of plain layers only; this model's cache has "
                f"{type(layer).__name__} layers: drive it with generate() (a driver does when the policy has no submit)"
            )
    return layers


def _crop_left(cache: Any, columns: int) -> None:
    for layer in _cache_layers(cache):
        layer.keys, layer.values = layer.keys[:, :, columns:], layer.values[:, :, columns:]


def _merge(running: _Batch | None, joining: _Batch | None) -> _Batch | None:
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
            for layer in _cache_layers(batch.cache):
                layer.keys, layer.values = F.pad(layer.keys, (0, 0, pad, 0)), F.pad(layer.values, (0, 0, pad, 0))
    for mine, theirs in zip(_cache_layers(running.cache), _cache_layers(joining.cache)):
        mine.keys = torch.cat([mine.keys, theirs.keys])
        mine.values = torch.cat([mine.values, theirs.values])
    return _Batch(
        running.entries + joining.entries,
        torch.cat([running.feed, joining.feed]),
        torch.cat([running.positions, joining.positions]),
        torch.cat([running.attention_mask, joining.attention_mask]),
        running.cache,
    )

class _Sampler:
    """Draws a batch's next tokens and their logprobs under the distribution each was drawn from.

    Temperature and top-p are transformers' own warpers; what is recorded is ``log_softmax`` of
    the warped fp32 logits (of the raw logits for greedy decoding, which takes the argmax). A row
    whose request has a ``seed`` draws from a generator of its own (:func:`_row_generator`), so it
    samples the same tokens whatever shares its batch and whenever other rows end; the other rows
    draw from torch's global generator."""

    def __init__(self, do_sample: bool, temperature: float, top_p: float) -> None:
        from transformers import TemperatureLogitsWarper, TopPLogitsWarper

        self.do_sample = do_sample
        self.warpers: list[Any] = []
        if do_sample and temperature != 1.0:
            self.warpers.append(TemperatureLogitsWarper(temperature))
        if do_sample and top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p=top_p))

    def __call__(self, logits: Any, generators: Sequence[Any]) -> tuple[Any, Any]:
        """The next token of each row of ``logits`` (``generators``: each row's, ``None`` for the
        global one) and its logprob."""
        import torch

        scores = logits.float()
        for warper in self.warpers:
            scores = warper(None, scores)
        logprobs = torch.log_softmax(scores, dim=-1)
        if not self.do_sample:
            chosen = scores.argmax(dim=-1)
        else:
            probs = logprobs.exp()
            chosen = torch.empty(len(generators), dtype=torch.long, device=scores.device)
            unseeded = [b for b, g in enumerate(generators) if g is None]
            for b, generator in enumerate(generators):
                if generator is not None:
                    chosen[b] = torch.multinomial(probs[b], 1, generator=generator)[0]
            if unseeded:
                chosen[unseeded] = torch.multinomial(probs[unseeded], 1).squeeze(1)
        return chosen, logprobs.gather(1, chosen[:, None]).squeeze(1)


def _row_generator(group: _Group, row: _Row, device: Any) -> Any:
    """The torch generator a sampled, seeded row draws from (``None``: the global one)."""
    import torch

    if not group.do_sample or row.request.sampling.seed is None:
        return None  # (greedy decoding draws nothing: no generator to seed)
    return torch.Generator(device=device).manual_seed(int(row.request.sampling.seed))
