"""The ``vllm-server`` backend: a running ``vllm serve`` (or our ``PolicyServer``) as the *trained*
generator, reached over HTTP, its weights replaced after every update.

Generation is the ``openai`` backend's (:class:`~agentgym_lightning.policies.openai.OpenAIPolicy`:
retries, replicas, batching), always asking for vLLM's token-id extension (``return_token_ids``)
and per-token logprobs, so trajectories are token-exact. The trainer loads its own copy of the
weights from ``model`` (a local folder or an embedded name): the same weights the server was
started with.

Weight sync (:meth:`VLLMServerPolicy.load_weights`), ``weight_transfer="folder"`` (the default;
CPU, or machines without a shared GPU fabric): the weights are written as safetensors to
``sync_dir``, a folder the server reads at the same path, and the server is told to reload them
(see :mod:`~agentgym_lightning.policies.served_weights` for the four calls and the server's
flags). ``weight_transfer="nccl"``: vLLM's weight-transfer API broadcasts the tensors from the
trainer's GPU to the server's (``vllm serve --weight-transfer-config '{"backend": "nccl"}'``);
written against vLLM's documentation, not run here (no GPUs).

LoRA adapters (``lora_per_agent``, :meth:`VLLMServerPolicy.load_adapter`): each version is loaded
under a new name (``writer@<run>-<n>``, ``/v1/load_lora_adapter``; the server needs
``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``), the previous one unloaded; a call
routed to ``writer`` is sent as the current name.

Versions: every sync sets a new weights version on the server, which stamps it on every answer
(a response header: the version when the call arrived, ``then->now`` when a sync came during it).
An answer from other weights than the last pushed — a server that restarted, a replica the sync
missed, a sync during the call, an adapter that is not the current one — is refused
(:class:`~agentgym_lightning.policies.openai.PolicyBackendError`: the episode is an
infrastructure failure, never trained on) and counted in :attr:`VLLMServerPolicy.stale_answers`
(the trainer logs ``generator/stale_answers``).

Asynchronous training (``max_staleness`` >= 1, :attr:`VLLMServerPolicy.syncs_during_calls`):
syncs come while calls run, so an answer is accepted when the weights it arrived at are the
ones pushed when it was sent *or later ones of this run* (a sync during the call: it finishes
on the newer weights, its running requests preempted and resumed by the server's prefix-cache
reset); older or foreign weights are still refused and counted. The trainer stamps each answer
with the version its generator held when the call was handed over
(:class:`~agentgym_lightning.training.generation.VersionStamping`): that sync had reached the
server before the call was sent, and the check makes sure the server answered with it or newer,
so a stamp never understates how stale an answer is.
"""

from __future__ import annotations

import contextvars
import logging
import shutil
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import httpx

from agentgym_lightning.llm import ADAPTER_KEY, BASE_ADAPTER, ChatRequest, Completion
from agentgym_lightning.policies.chat import stop_token_ids
from agentgym_lightning.policies.models import DEFAULT_MODEL_NAME, resolve_model
from agentgym_lightning.policies.openai import OpenAIPolicy, PolicyBackendError
from agentgym_lightning.policies.served_weights import (
    INITIAL_VERSION,
    RELOAD_METHOD,
    VERSION_HEADER,
    VERSION_PATH,
    unique_tensors,
    write_weights,
)

__all__ = ["VLLMServerPolicy", "SERVER_FLAGS"]

log = logging.getLogger(__name__)

#: What the server held when the current call was sent — ``(this policy's sync count, the
#: adapter's served name)`` — set by ``build_body`` and read by ``_completion``: both run in the
#: call's own asyncio task (or, sent from the caller's thread, in that thread), so concurrent
#: calls never see each other's.
_SENT: contextvars.ContextVar[tuple[int, str | None]] = contextvars.ContextVar("agentgym_vllm_server_sent")

#: What ``vllm serve`` needs to be this backend's generator (with ``VLLM_SERVER_DEV_MODE=1`` in its
#: environment, and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` plus ``--enable-lora`` for adapters).
SERVER_FLAGS = (
    "--worker-extension-cls agentgym_lightning.policies.served_weights.WeightSyncExtension "
    "--middleware agentgym_lightning.policies.served_weights.WeightsVersionMiddleware "
    "--logprobs-mode processed_logprobs"
)


def _root(url: str) -> str:
    """The server's root URL from ``http://host:port`` or its OpenAI base ``.../v1``."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class VLLMServerPolicy(OpenAIPolicy):
    """A served generator whose weights the trainer replaces (see the module docstring).

    Args:
        model: The weights the server was started with: an embedded name, a local folder or a
            Hugging Face id in the local cache (the trainer copies them; the tokenizer comes from
            there).
        generator_url: The server's URL (``http://host:8000`` or ``.../v1``), or a list of
            replicas' (each gets every sync).
        served_model: The name the server serves the model under (``vllm serve
            --served-model-name``); empty: the first one ``/v1/models`` lists.
        sync_dir: The folder the weights are written to, at a path the server reads too
            (a shared file system across machines). Default: a new folder in ``/dev/shm``
            (same machine only), removed on :meth:`close`.
        weight_transfer: ``"folder"`` (safetensors + reload) or ``"nccl"`` (vLLM's weight-transfer
            API over NCCL; GPUs only, untested here).
        nccl_init: For ``"nccl"``: the rendezvous host and port the server's workers connect to
            (``{"master_address": ..., "master_port": ...}``).
        admin_timeout: Seconds a sync call (reload, adapter load) may take.
        seed: A sampling seed for requests that give none.
        progress: Print the one-line message when the embedded model is converted on first use.
        syncs_during_calls: Asynchronous training: weights are pushed while calls run, and an
            answer from the weights pushed when it was sent or later ones is accepted (module
            docstring). The trainer sets it when ``max_staleness`` >= 1.
        stop_tokens: Tokens, named by their text, that end every completion as EOS does (sent as
            vLLM's ``stop_token_ids``), e.g. ``["<|im_start|>"]``; as
            :class:`~agentgym_lightning.policies.hf.HFPolicy`'s. A ``PolicyServer`` generator
            ignores the field: give the policy it serves ``stop_tokens`` instead.
        **openai_kwargs: Any other :class:`OpenAIPolicy` option (``concurrency``, ``timeout``...).
    """

    backend = "vllm-server"

    def __init__(
        self,
        model: str = DEFAULT_MODEL_NAME,
        *,
        generator_url: str | Sequence[str] | None = None,
        served_model: str = "",
        sync_dir: str | None = None,
        weight_transfer: Literal["folder", "nccl"] = "folder",
        nccl_init: Mapping[str, Any] | None = None,
        admin_timeout: float = 600.0,
        seed: int | None = None,
        progress: bool = True,
        syncs_during_calls: bool = False,
        stop_tokens: Sequence[str] = (),
        **openai_kwargs: Any,
    ) -> None:
        if not generator_url:
            raise ValueError(
                "the vllm-server backend needs the generator's URL: --generator-url http://host:8000 "
                "(a `vllm serve` started as docs/scaling.md shows, or a PolicyServer)"
            )
        if weight_transfer not in ("folder", "nccl"):
            raise ValueError(f"weight_transfer must be 'folder' or 'nccl', got {weight_transfer!r}")
        from transformers import AutoTokenizer

        urls = [generator_url] if isinstance(generator_url, str) else list(generator_url)
        self.roots = [_root(u) for u in urls]
        defaults = dict(openai_kwargs.pop("sampling_defaults", None) or {})
        if seed is not None:
            defaults.setdefault("seed", int(seed))
        super().__init__(
            served_model,
            base_url=[f"{r}/v1" for r in self.roots],
            return_token_ids=True,
            logprobs=True,
            sampling_defaults=defaults,
            **openai_kwargs,
        )
        self.model_name = str(model)
        self.path = str(resolve_model(model, progress=progress))
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        self._stop_token_ids = sorted(stop_token_ids(self.tokenizer, stop_tokens))
        self.weight_transfer = weight_transfer
        self.nccl_init = dict(nccl_init or {})
        self._admin = httpx.Client(timeout=admin_timeout, headers=self._headers, trust_env=False)
        self._own_dir = sync_dir is None
        self._sync_dir = Path(sync_dir) if sync_dir else None
        self._run = uuid.uuid4().hex[:8]
        self._sync_lock = threading.Lock()
        self._nccl: Any = None
        #: How many times the weights (or an adapter) were replaced.
        self.weights_version = 0
        #: The version every answer must carry (the server's until the first sync: its own weights).
        self.expected_version = INITIAL_VERSION
        #: Answers refused because other weights than the last pushed wrote them.
        self.stale_answers = 0
        #: Whether syncs come while calls run (asynchronous training; see the module docstring).
        self.syncs_during_calls = syncs_during_calls
        #: adapter name -> the name its current version is served under.
        self.adapters: dict[str, str] = {}
        self._adapter_dirs: dict[str, Path] = {}
        try:
            versions = self.server_version()
        except BaseException:
            self.close()  # the I/O thread and connections already made
            raise
        for root, version in zip(self.roots, versions):
            if version != INITIAL_VERSION:
                log.warning(
                    "the generator at %s serves weights pushed earlier (version %r), not %s's: its answers are refused "
                    "as stale until this run's first sync (restart the server to start from the model's weights)",
                    root, version, self.model_name,
                )

    # ------------------------------------------------------------------ generation

    def build_body(self, request: ChatRequest) -> dict[str, Any]:
        body = super().build_body(request)
        if self._stop_token_ids:
            body["stop_token_ids"] = self._stop_token_ids  # vLLM's extension of the chat API
        adapter = request.metadata.get(ADAPTER_KEY)
        if adapter and adapter != BASE_ADAPTER:
            if adapter not in self.adapters:
                raise ValueError(
                    f"the request asks for the LoRA adapter {adapter!r}, which was never loaded into the generator "
                    f"(it has {sorted(self.adapters) or 'none'}): load it with load_adapter"
                )
            body["model"] = self.adapters[adapter]
        _SENT.set((self.weights_version, body["model"] if adapter and adapter != BASE_ADAPTER else None))
        return body

    def _completion(self, request: ChatRequest, data: Any) -> Completion:
        version = data.pop(VERSION_HEADER, None) if isinstance(data, dict) else None
        completion = super()._completion(request, data)
        expected = self.expected_version
        adapter = request.metadata.get(ADAPTER_KEY)
        served = self.adapters.get(adapter) if adapter and adapter != BASE_ADAPTER else None
        problem = None
        if self.syncs_during_calls:
            problem = self._older_than_sent(version, completion.model, served)
        elif version != expected:
            problem = f"written by weights version {version!r}, not the last pushed {expected!r}"
        elif served is not None and completion.model != served:
            problem = f"written by adapter {completion.model!r}, not its current version {served!r}"
        if problem is not None:
            with self._counter_lock:
                self.stale_answers += 1
            raise PolicyBackendError(
                f"stale answer from the generator at {self.base_url}: {problem} (a server that restarted or a replica "
                "a sync missed); refused, not trained on",
            )
        return completion

    def score(self, prompt_ids: Sequence[int], completion_ids: Sequence[int], adapter: str | None = None) -> list[float]:
        """The server's logprob of each completion token given everything before it (vLLM's
        ``prompt_logprobs`` over prompt+completion, temperature 1): what the trainer's model
        computes for the same ids, so a sync can be checked. ``vllm serve`` only."""
        if not completion_ids:
            return []
        body = {
            "model": self.adapters[adapter] if adapter else (self.model or self._first_model()),
            "prompt": list(prompt_ids) + list(completion_ids),
            "max_tokens": 1,
            "temperature": 1.0,
            "prompt_logprobs": 0,
        }
        data = self._post(self.roots[0], "/v1/completions", body)
        positions = data["choices"][0]["prompt_logprobs"][len(prompt_ids) :]
        return [float(pos[str(tok)]["logprob"]) for tok, pos in zip(completion_ids, positions)]

    # ------------------------------------------------------------------ weight sync

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """Replace every weight of the served model: ``(name, tensor)`` pairs under the checkpoint's
        (Hugging Face) names, all of them (vLLM fuses some: a partial push corrupts the rest)."""
        with self._sync_lock:
            if self.weight_transfer == "nccl":
                self._send_nccl(weights)
            else:
                folder = self._folder()
                write_weights(weights, folder)
                for root in self.roots:
                    self._post(root, "/collective_rpc", {"method": RELOAD_METHOD, "kwargs": {"weights_path": str(folder)}})
            for root in self.roots:
                self._reset_prefix_cache(root)
            self._bump()

    def load_adapter(self, name: str, folder: str | Path) -> None:
        """Load the PEFT adapter in ``folder`` as the new version of ``name`` (under a new served
        name), then unload the previous version; later calls routed to ``name`` use it."""
        with self._sync_lock:
            version = self.weights_version + 1
            served = f"{name}@{self._run}-{version}"
            target = self._folder() / "adapters" / served
            shutil.copytree(folder, target)
            for root in self.roots:
                self._post(root, "/v1/load_lora_adapter", {"lora_name": served, "lora_path": str(target)})
            previous, previous_dir = self.adapters.get(name), self._adapter_dirs.get(name)
            self.adapters[name], self._adapter_dirs[name] = served, target
            if previous is not None:
                for root in self.roots:
                    self._post(root, "/v1/unload_lora_adapter", {"lora_name": previous})
            if previous_dir is not None:
                shutil.rmtree(previous_dir, ignore_errors=True)
            self._bump()

    def server_version(self) -> list[str]:
        """Each replica's weights version now."""
        return [self._server_version(root) for root in self.roots]

    def close(self) -> None:
        super().close()
        self._admin.close()
        if self._own_dir and self._sync_dir is not None:
            shutil.rmtree(self._sync_dir, ignore_errors=True)

    # ------------------------------------------------------------------ internals

    def _older_than_sent(self, version: str | None, model: str | None, served: str | None) -> str | None:
        """With syncs during calls: what is wrong with an answer stamped ``version`` (``then`` or
        ``then->now``) by ``model``, or ``None`` when it came from the weights pushed when it was
        sent or later ones of this run."""
        sent, sent_adapter = _SENT.get((self.weights_version, served))
        syncs = [self._sync_count(v) for v in (version or "").split("->")]
        if None in syncs:
            return f"written by weights version {version!r}, which this run never pushed"
        if syncs[0] < sent:  # type: ignore[operator]
            return f"written by weights version {version!r}, older than the version {sent} pushed when the call was sent"
        if served is not None and model not in (sent_adapter, served):
            return f"written by adapter {model!r}, neither its version when the call was sent ({sent_adapter!r}) nor its current one ({served!r})"
        return None

    def _sync_count(self, version: str) -> int | None:
        """How many of this policy's syncs the server had had at ``version`` (``None``: a version
        this policy never pushed)."""
        if version == INITIAL_VERSION:
            return 0
        run, _, count = version.rpartition("-")
        return int(count) if run == self._run and count.isdigit() else None

    def _bump(self) -> None:
        version = f"{self._run}-{self.weights_version + 1}"
        for root in self.roots:
            self._post(root, VERSION_PATH, {"version": version})
        self.weights_version += 1
        self.expected_version = version

    def _reset_prefix_cache(self, root: str, attempts: int = 50) -> None:
        # vLLM answers {"success": false} while blocks are still held (a request finishing).
        for _ in range(attempts):
            # Requests running during a sync (asynchronous training) are preempted and resume on
            # the new weights; without them the reset fails while they hold old weights' blocks.
            answer = self._post(root, "/reset_prefix_cache?reset_running_requests=true", None)
            if not isinstance(answer, dict) or answer.get("success", True):
                return
            time.sleep(0.1)
        raise PolicyBackendError(f"{root}/reset_prefix_cache kept answering success=false: requests still hold cached blocks of the old weights")

    def _folder(self) -> Path:
        # One folder for the policy's life: vLLM re-points the model's config at it.
        if self._sync_dir is None:
            shm = Path("/dev/shm")
            self._sync_dir = Path(tempfile.mkdtemp(prefix="agentgym-generator-", dir=shm if shm.is_dir() else None))
            # A whole model in memory: removed at close, or when the policy is dropped unclosed
            # (the train command does not close the policy the trainer built).
            weakref.finalize(self, shutil.rmtree, self._sync_dir, ignore_errors=True)
        self._sync_dir.mkdir(parents=True, exist_ok=True)
        return self._sync_dir

    def _first_model(self) -> str:
        data = self._admin.get(f"{self.roots[0]}/v1/models").json()
        self.model = str(data["data"][0]["id"])
        return self.model

    def _server_version(self, root: str) -> str:
        try:
            response = self._admin.get(root + VERSION_PATH)
        except httpx.HTTPError as exc:
            raise PolicyBackendError(f"the generator at {root} cannot be reached: {exc}") from exc
        if response.status_code == 404:
            raise ValueError(
                f"the generator at {root} reports no weights version ({VERSION_PATH}: 404): start `vllm serve` with "
                f"VLLM_SERVER_DEV_MODE=1 and {SERVER_FLAGS} (docs/scaling.md), or serve a PolicyServer"
            )
        response.raise_for_status()
        return str(response.json()["version"])

    def _post(self, root: str, path: str, body: Any) -> Any:
        start = time.perf_counter()
        try:
            response = self._admin.post(root + path, json=body)
        except httpx.HTTPError as exc:
            raise PolicyBackendError(f"POST {root}{path} failed: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            hint = ""
            if response.status_code == 404 and path.partition("?")[0] in ("/collective_rpc", "/reset_prefix_cache"):
                hint = " (start `vllm serve` with VLLM_SERVER_DEV_MODE=1: these are its dev-mode routes)"
            elif path.endswith("lora_adapter"):
                hint = " (start `vllm serve` with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)"
            raise PolicyBackendError(
                f"POST {root}{path} answered {response.status_code}: {response.text[:500]}{hint}",
                status=response.status_code, body=response.text[:4096],
            )
        log.debug("POST %s%s took %.2f s", root, path, time.perf_counter() - start)
        try:
            return response.json()
        except ValueError:
            return response.text

    def _send_nccl(self, weights: Iterable[tuple[str, Any]]) -> None:
        """One round of vLLM's weight-transfer API over NCCL (vLLM's own trainer-side engine:
        ``WeightTransferTrainerFactory.trainer_init`` once per replica, then ``send_weights``,
        which drives ``/start_weight_update``, ``/update_weights`` and ``/finish_weight_update``).
        The tensors must be on the trainer's GPU. Written against vLLM 0.32's documented API;
        not run here (no GPUs)."""
        pairs = unique_tensors(weights)
        if self._nccl is None:
            self._nccl = _nccl_senders(self.roots, self.nccl_init, self._admin)
        for source, engine in self._nccl:
            source.pairs = pairs
            engine.send_weights()


def _nccl_senders(roots: Sequence[str], nccl_init: Mapping[str, Any], admin: httpx.Client) -> list[tuple[Any, Any]]:
    """A (weight source, vLLM trainer engine) pair per replica, each rendezvoused with that
    server's workers (NCCL rank 0 here, the server's workers after it; replica ``i`` on
    ``master_port + i``). Needs vLLM installed next to the trainer and ``vllm serve
    --weight-transfer-config '{"backend": "nccl"}'``."""
    try:
        from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo
    except ImportError as exc:
        raise ImportError(f"weight_transfer='nccl' uses vLLM's weight-transfer API on the trainer's side: pip install vllm ({exc})") from exc
    missing = {"master_address", "master_port"} - set(nccl_init)
    if missing:
        raise ValueError(f"weight_transfer='nccl' needs nccl_init with {sorted(missing)}: where the server's workers meet the trainer")

    class PairsSource(WeightSource):  # the pairs of the current sync, replayed to vLLM's engine
        pairs: list[tuple[str, Any]] = []

        def metadata(self) -> list[Any]:
            return [ParamMeta(name=n, dtype=t.dtype, shape=tuple(t.shape)) for n, t in self.pairs]

        def __iter__(self) -> Any:
            return iter(self.pairs)

    senders = []
    for i, root in enumerate(roots):
        world = admin.get(f"{root}/get_world_size").json()["world_size"]
        source = PairsSource()
        info = NCCLTrainerInitInfo(
            master_address=str(nccl_init["master_address"]), master_port=int(nccl_init["master_port"]) + i,
            world_size=1 + int(world), rank=0,
        )
        senders.append((source, WeightTransferTrainerFactory.trainer_init(info, client=HTTPVLLMWeightSyncClient(root), source=source)))
    return senders
