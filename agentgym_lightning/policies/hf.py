"""The ``hf`` backend: a transformers causal LM, decoded per step, token-exact, CPU or GPU.

This module is the policy (loading, the request's plan, adapters, weights, ``generate`` and
``submit``); the decode loop is :class:`~agentgym_lightning.policies.hf_scheduler.StepScheduler`
(with :mod:`~agentgym_lightning.policies.hf_rows`, :mod:`~agentgym_lightning.policies.hf_kv` and
:mod:`~agentgym_lightning.policies.hf_slots`), which reads only the policy's public attributes.

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

Sampling parameters are honoured per request: requests of any ``(temperature, top_p)`` share a
batch (each row is sampled with its own warpers), and ``max_tokens`` and ``stop`` are applied per row,
so an agent asking for 16 tokens is not held to its neighbour's 256. A request with a ``seed``
draws its tokens from a generator of its own, seeded with it: it samples the same completion
whatever else shares its batch (the trainer relies on this to make runs reproducible). No ``top_k`` is
applied (OpenAI has none), and the model's own ``generation_config`` sampling defaults are
ignored: what the request says is what is sampled. ``n`` (one completion per request),
``tool_choice``, the presence/frequency penalties and ``logprobs``/``top_logprobs`` are ignored
(sampled-token logprobs are always returned).

**Per-step scheduling**, the one decode loop. The policy takes requests one at a time
(:meth:`HFPolicy.submit`): each joins the running batch at the next decode step and its future
resolves the moment its row ends (the driver uses it whenever a policy has ``submit``).
``generate`` (a batch in, its answers out) queues its requests together on the same scheduler
and waits for them. The completions are the same either way (seeded rows draw from their own
generators; greedy ones agree up to fp32 rounding of logits computed in another batch).
transformers' own continuous batching (``generate_batch``) is not used: it samples every row
from the global generator with one ``do_sample`` for all (no per-row seeded draws), and has no
stop strings or per-row adapters. The batch mode that decoded each batch to its end
(``scheduling="batches"``) was removed; passing it is an error that says so.

**Keys and values across calls** (``prefix_cache_mb``). A row that ends leaves its keys and values
in a :class:`~agentgym_lightning.policies.prefix_cache.PrefixCache` (least recently used out, within
the budget); a call whose prompt begins with one of them (the same episode's next call: its last
prompt and completion, then the tool's answer; another episode's system prompt) takes the longest
such prefix, from there or from a running row, and prefills only the rest (``submit``'s calls;
``generate``'s batches neither take from the cache nor leave anything there). The cache is emptied
when the weights change (:meth:`HFPolicy.weights_version`), and a row prefilled before a change
neither lends its prefix nor is kept. :meth:`HFPolicy.prefill_stats` counts prompt tokens sent
and computed (the trainer logs them per step as ``generator/...``).

**The decode step** (``decode``). The per-step scheduler's running batch keeps its keys and values
in a dynamic cache (``"dynamic"``, the default: it grows and shrinks with the batch) or in
a static one of fixed shape, ``max_batch_size`` slots by ``static_cache_len`` columns
(:class:`~agentgym_lightning.policies.hf_slots.Slots`; ``"static"``), whose decode step has the same shapes every time, so it can be
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

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future

from agentgym_lightning.llm import ADAPTER_KEY, BASE_ADAPTER, ChatRequest, Completion
from agentgym_lightning.policies.base import Policy
from agentgym_lightning.policies.chat import completion_of, render_prompt_ids, request_stop_token_ids, stop_token_ids
from agentgym_lightning.policies.hf_kv import MIN_SHARED_PREFIX
from agentgym_lightning.policies.hf_rows import GREEDY, Entry, Row, Sampling, row_generator
from agentgym_lightning.policies.hf_scheduler import PrefillCounts, StepScheduler
from agentgym_lightning.policies.models import DEFAULT_MODEL_NAME, resolve_model
from agentgym_lightning.policies.prefix_cache import DEFAULT_PREFIX_CACHE_MB, PrefixCache
from agentgym_lightning.policies.tool_calls import check_tool_prompt

__all__ = ["HFPolicy", "SCHEDULING", "DECODE"]

log = logging.getLogger(__name__)

#: ``HFPolicy(scheduling=...)``: kept for old callers; per-step is the only mode (the batch mode was removed).
SCHEDULING = ("per-step",)
#: ``HFPolicy(decode=...)``: the per-step scheduler's decode step (see :class:`HFPolicy`).
DECODE = ("auto", "dynamic", "static", "compiled")


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
        decode_threads: CPU threads for the decode step alone (the scheduler's thread; ``None``:
            the process's, ``num_threads``). A decode step of a few dozen rows is skinny matrix
            products that scale poorly past one thread, while an update's large ones scale well:
            ``decode_threads=1`` with the update on every core spends fewer CPU-seconds on a
            rollout (docs/training.md, "Threads for the decode").
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
        prefix_cache_mb: megabytes of keys and values kept after calls end (:meth:`submit`'s,
            not :meth:`generate`'s), so that a later call beginning with the same tokens (the
            same episode's next call: its previous prompt and completion; another episode's system
            prompt and schema) prefills only the rest (:class:`~agentgym_lightning.policies.prefix_cache.PrefixCache`;
            least recently used out first; emptied when the weights change). ``0``: none kept.
        scheduling: only ``"per-step"`` (or left out): kept so that old callers that name it
            still run. ``"batches"`` (the batch mode, removed) and anything else raise a
            ``ValueError`` that says so.
        decode: how the per-step scheduler's decode step runs. ``"dynamic"``: a KV cache that
            grows and shrinks with the batch (transformers' ``DynamicCache``). ``"static"``: a
            KV cache of fixed shape (``max_batch_size`` slots x ``static_cache_len`` columns,
            :class:`~agentgym_lightning.policies.hf_slots.Slots`), so every decode step has the same shapes. ``"compiled"``: the
            static cache with the decode step compiled (``torch.compile``, mode
            ``reduce-overhead``: CUDA graphs on a GPU). ``"auto"`` (default): ``"dynamic"``, on
            CUDA too: measured on an H200, the Spider step's rollout (16 agent episodes whose calls
            come and go) took 21.8 s dynamic and 29.5 s compiled, since the fixed shapes compute
            every slot, idle or not (docs/training.md); on CPU a step is compute-bound and the
            fixed shapes only add work. A model the static cache cannot serve (a PEFT model, a cache of other than
            plain layers) decodes dynamically, and a compile that fails falls back to the static
            cache uncompiled; each is said once in the log. Prefills are always dynamic;
            :meth:`generate`'s rows decode as :meth:`submit`'s do.
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
        decode_threads: int | None = None,
        progress: bool = True,
        tool_prompt: str = "full",
        prefix_caching: bool = True,
        prefix_cache_mb: float = DEFAULT_PREFIX_CACHE_MB,
        scheduling: str | None = None,
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
        if decode_threads is not None and decode_threads < 1:
            raise ValueError(f"decode_threads must be >= 1 (or None: the process's threads), got {decode_threads}")
        if scheduling is not None and scheduling != "per-step":
            raise ValueError(
                f"HFPolicy(scheduling={scheduling!r}): the batch mode (scheduling='batches') was removed; every call, "
                "generate's too, goes through the per-step scheduler, the only mode: leave scheduling out"
            )
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
        self.prefix_cache = PrefixCache(int(prefix_cache_mb * 2**20), min_shared=MIN_SHARED_PREFIX)
        self._counts = PrefillCounts()  # prompt tokens of submit's calls, and of them those computed
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
        self.decode_threads: int | None = decode_threads
        self._lock = threading.Lock()
        self._scheduler_lock = threading.Lock()
        self._scheduler: StepScheduler | None = None  # started by the first call
        self._closed = False

    # ----------------------------------------------------------------------------- public

    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        """One :class:`Completion` per request, in order (see the module docstring for exactly
        what the ids and logprobs are). The requests are planned (a bad one raises before any
        runs), queued together on the step scheduler and waited for: they are prefilled
        together, sharing prompt prefixes, and decode in the running batch beside whatever else
        runs. A batch is answered as a batch: its rows take no keys and values from the prefix
        cache across calls nor leave any there, and are not counted in :meth:`prefill_stats`
        (:meth:`submit`'s calls are). Thread-safe."""
        if self._closed:
            raise RuntimeError("HFPolicy.generate called after close()")
        planned = [self._plan(i, request, across_calls=False) for i, request in enumerate(requests)]
        entries = [entry for entry, _ in planned if entry is not None]
        if entries:
            self._scheduled().put(*entries)
        return [future.result() for _, future in planned]

    def submit(self, request: ChatRequest) -> Future[Completion]:
        """Answer ``request`` with iteration-level scheduling: it is prefilled (with the requests
        submitted alongside it, sharing their prompt prefixes, or on a running row's or the
        prefix cache's keys and values) and joins the running batch at the next decode step; the
        future resolves the moment its row ends, whatever else still runs (see
        :class:`~agentgym_lightning.policies.base.SchedulingPolicy`). A seeded request gets the
        same completion as from :meth:`generate`; so does a greedy one, up to fp32 rounding of
        logits computed in another batch. A request that cannot be planned raises here;
        cancelling the future drops its row at the next step."""
        if self._closed:
            raise RuntimeError("HFPolicy.submit called after close()")
        entry, future = self._plan(0, request, across_calls=True)
        if entry is not None:
            self._scheduled().put(entry)
        return future

    def paused(self) -> threading.Lock:
        """A context in which no decode step runs (the step scheduler waits at its next
        iteration): the trainer copies new weights into :attr:`hf_model` inside it while
        episodes run (asynchronous training), so every step reads one version of them."""
        return self._lock

    def prefill_stats(self) -> dict[str, float]:
        """Counts since the policy started, of the calls :meth:`submit` answered: ``prompt_tokens``
        (their prompts' tokens), ``prefilled_tokens`` (those computed: not taken from another row's
        keys and values or the prefix cache), ``prefix_cache_hits`` (calls that took a prefix from
        the cache); and the cache now: ``prefix_cache_tokens``, ``prefix_cache_mb``."""
        cache, counts = self.prefix_cache, self._counts
        return {"prompt_tokens": float(counts.prompt_tokens), "prefilled_tokens": float(counts.prefilled_tokens),
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

    def _plan(self, index: int, request: ChatRequest, *, across_calls: bool) -> tuple[Entry | None, Future[Completion]]:
        """``request``'s entry for the step scheduler and its future, or, when there is nothing
        to generate, no entry and its answer (the bad request raises here, before any is queued)."""
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
        row = Row(index=index, request=request, prompt_ids=prompt_ids, max_tokens=max_tokens, stops=stops, adapter=adapter,
                  stop_ids=request_stop_token_ids(request, len(self.tokenizer)))
        sampling = Sampling(True, temperature, top_p) if temperature > 0 else GREEDY
        future: Future[Completion] = Future()
        if row.max_tokens <= 0:
            # The prompt fills the context window (or max_tokens was 0): nothing to generate.
            future.set_result(completion_of(self.tokenizer, self.model, request, prompt_ids, [], [], "length"))
            return None, future
        return Entry(row, sampling, future, row_generator(sampling, row, self.device), across_calls=across_calls), future

    def _scheduled(self) -> StepScheduler:
        """The step scheduler, started on first use."""
        with self._scheduler_lock:
            if self._scheduler is None:
                self._scheduler = StepScheduler(self, self._counts)
            return self._scheduler
