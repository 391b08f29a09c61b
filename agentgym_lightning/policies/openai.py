"""The ``openai`` backend: any OpenAI-compatible chat-completions server answers the env's calls.

Use it for evaluation and data collection against ``vllm serve``, ``trl vllm-serve``, SGLang or a
hosted API::

    policy = OpenAIPolicy("Qwen/Qwen2.5-7B-Instruct", base_url="http://127.0.0.1:8000/v1")
    completions = policy.generate(requests)

Each request's messages, tools and sampling options are forwarded as they came from the agent (a
legacy completion's raw prompt goes to the server's ``/completions``, no chat template); a
batch is sent concurrently (every request of it in flight at once, up to ``concurrency``) from one
asyncio loop on a thread of the policy's own (aiohttp), each request on a keep-alive connection of
its own — there is no hidden cap at 100 connections; a batch of one goes out from the caller's
thread through the standard library's http.client (see :mod:`._http` and ``bench/bench_openai_transport.py``).

Token ids: vLLM returns them when asked (``return_token_ids: true``, an extension:
``prompt_token_ids`` at the top level of the response, ``token_ids`` in each choice); per-token
logprobs come from the standard ``logprobs: true`` (``choices[0].logprobs.content[i].logprob``).
A server that does not give them leaves :class:`~agentgym_lightning.llm.Completion`'s
``prompt_token_ids``/``completion_token_ids``/``logprobs`` as ``None``: unavailable, never
guessed. With ``return_token_ids="auto"`` (the default) the extension is asked for until the
server rejects it once (a 400 naming the field, as OpenAI's own API answers), then no more.
The trainer's generator served to its Ray workers (``policies/policy_server.py``) also says which
policy version answered (a top-level ``policy_version``): it becomes ``Completion.policy_version``.

Replicas: ``base_url`` may list several servers serving the same model (``vllm serve`` on each
GPU); requests are spread over them, sticky per episode (an episode's calls all go to one replica,
so its growing prompt hits that server's prefix cache). The episode is the request's
``metadata["agentgym_episode"]`` (the rollout driver sets it), else its first two messages. A
replica that fails at the connection level (refused, reset, timed out) is taken out of rotation
for ``replica_cooldown`` seconds and the request goes to another one at once; its episodes move
to the remaining replicas (rendezvous hashing: the others' episodes stay where they are).

Adapters: a request routed to a LoRA adapter (``metadata["agentgym_adapter"]``, set by the
trainer's ``lora_per_agent`` routing) is sent with that adapter's name as its ``model``, which is
how ``vllm serve --enable-lora --lora-modules name=path`` and the trainer's ``PolicyServer`` select it.

Scheduling: besides ``generate`` (a batch in, its answers out) the policy takes calls one at a
time (:meth:`OpenAIPolicy.submit`): each is sent the moment it is submitted and its future
resolves when its own answer arrives, so a driver hands it every call as the agents make it
(the server's own continuous batching schedules them) instead of gathering batches.

Failures: a request the upstream still fails after ``max_retries`` retries (connection errors,
timeouts, 408/409/429/5xx; other 4xx are not retried) makes :meth:`OpenAIPolicy.generate` raise
:class:`PolicyBackendError`, which callers classify as an infrastructure failure (not the
model's fault). It is raised once every request of the batch has finished, and carries the
completions that did succeed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import threading
import time
import zlib
from collections.abc import Generator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, Literal

import httpx

from agentgym_lightning.background_loop import BackgroundLoop
from agentgym_lightning.llm import ADAPTER_KEY, BASE_ADAPTER, EPISODE_KEY, ChatRequest, Completion, ToolCall
from agentgym_lightning.policies._http import AiohttpTransport, SyncHTTP, TransportFailure, env_proxy, pick_transport
from agentgym_lightning.policies.base import Policy
from agentgym_lightning.policies.served_weights import VERSION_HEADER

__all__ = ["OpenAIPolicy", "PolicyBackendError", "DEFAULT_CONCURRENCY", "RETRY_STATUSES", "EPISODE_KEY"]

log = logging.getLogger(__name__)

#: Default for ``concurrency`` (and so the connection pool): requests in flight at once.
DEFAULT_CONCURRENCY = 1024
#: HTTP statuses that are retried (with backoff); any other error status fails at once.
RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})

# Request keys we never forward upstream: we do not stream upstream (the gateway re-streams to
# the agent itself), we return exactly one choice, and ``metadata`` is our own annotation (e.g.
# ``{"trainable": "false"}``) unless ``forward_metadata`` says otherwise.
_DROPPED_KEYS = ("stream", "stream_options", "n")
#: One request's retry and fail-over decisions (:meth:`OpenAIPolicy._attempts`): it yields
#: ``(delay, replica)``, is sent each attempt's outcome, and returns the decoded response.
_Attempts = Generator[tuple[float | None, int], Any, Any]


class PolicyBackendError(RuntimeError):
    """The policy's upstream failed: an infrastructure failure, not a model output.

    Attributes:
        status: The last HTTP status from the upstream, or ``None`` for a connection error or
            timeout (or for a batch error, see ``failures``).
        body: The upstream's error body (text, at most a few KiB), if any.
        retryable: Whether the failure was of a kind that is retried (it was, ``attempts`` times).
        attempts: How many times the request was sent.
        failures: For an error raised by :meth:`OpenAIPolicy.generate`: request index → the
            error of each failed request of the batch.
        completions: For a batch error: one entry per request, the :class:`Completion` of those
            that succeeded and ``None`` for those that failed.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        body: str | None = None,
        retryable: bool = False,
        attempts: int = 1,
        failures: Mapping[int, PolicyBackendError] | None = None,
        completions: Sequence[Completion | None] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        self.retryable = retryable
        self.attempts = attempts
        self.failures: dict[int, PolicyBackendError] = dict(failures or {})
        self.completions: list[Completion | None] = list(completions or [])


def _int_list(value: Any) -> list[int] | None:
    """``value`` as a list of ints if it is one (a server's token ids), else ``None``."""
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None
    return list(value)


def _token_logprobs(choice: Mapping[str, Any]) -> list[float] | None:
    """The sampled tokens' logprobs from an OpenAI choice, or ``None`` when absent."""
    lp = choice.get("logprobs")
    if not isinstance(lp, Mapping):
        return None
    content = lp.get("content")
    if not isinstance(content, list):
        # A legacy completion's: {"tokens": [...], "token_logprobs": [...]}.
        content = [{"logprob": x} for x in lp["token_logprobs"]] if isinstance(lp.get("token_logprobs"), list) else None
    if content is None:
        return None
    out: list[float] = []
    for entry in content:
        value = entry.get("logprob") if isinstance(entry, Mapping) else None
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return None
        out.append(float(value))
    return out


def _snippet(text: str, limit: int = 4096) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit} more chars)"


def _error_message(body: str) -> str:
    """The ``error.message`` of an OpenAI-style error body, else the body itself."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, ValueError):
        return body
    if isinstance(data, Mapping):
        err = data.get("error", data)
        if isinstance(err, Mapping) and err.get("message"):
            return str(err["message"])
        if isinstance(data.get("detail"), str):  # FastAPI-style
            return str(data["detail"])
    return body


class OpenAIPolicy(Policy):
    """A policy served by an OpenAI-compatible ``/v1/chat/completions`` endpoint.

    Args:
        model: The upstream's model name (sent as ``model``). Empty (or ``"auto"``): the first
            model the server lists at ``GET {base_url}/models``, asked once.
        base_url: The server's OpenAI base URL, e.g. ``http://127.0.0.1:8000/v1``, or a list of
            replicas' (see the module docstring). Defaults to ``$OPENAI_BASE_URL``.
        api_key: Bearer token; defaults to ``$OPENAI_API_KEY`` (none sent if neither is set).
        concurrency: Requests (and so HTTP connections) in flight at once across all
            ``generate`` calls; default :data:`DEFAULT_CONCURRENCY` = 1024. With ``concurrency >=
            batch size`` every request of a batch reaches the upstream at once; beyond it,
            requests wait for a free slot. Connections are opened as needed and kept alive.
        timeout: Seconds to wait for one response (a long generation may take minutes).
        connect_timeout: Seconds to wait for a connection.
        max_retries: Retries of a request that failed with a connection error, a timeout or a
            status in :data:`RETRY_STATUSES`; exponential backoff from ``retry_backoff`` seconds
            (with jitter, capped at 30 s; a ``Retry-After`` header of at most 60 s is honoured).
        retry_backoff: First backoff delay in seconds.
        return_token_ids: Ask for token ids with vLLM's ``return_token_ids`` extension: ``True``
            always, ``False`` never, ``"auto"`` until the server rejects the field once.
        logprobs: Ask for per-token logprobs (``logprobs: true``): ``True``, ``False`` or
            ``"auto"`` (ask until the server rejects the field once).
        text_tool_calls: When the request had tools but the server returned no structured
            ``tool_calls`` (e.g. ``vllm serve`` without ``--tool-call-parser``), parse
            ``<tool_call>{json}</tool_call>`` blocks out of the text like the token-level
            backends do.
        forward_metadata: Send the request's ``metadata`` upstream (off: it is our annotation).
        sampling_defaults: Sampling options used where a request does not set them (e.g.
            ``{"max_tokens": 512}``).
        sampling_overrides: Sampling options forced on every request (e.g. ``{"temperature": 1.0}``
            for on-policy data collection).
        extra_body: Extra JSON fields added to every request (e.g. ``{"top_k": 20}`` for vLLM).
        headers: Extra HTTP headers for every request.
        sync_single: Send a batch of one from the calling thread (the standard library's http.client)
            instead of through the policy's I/O loop (aiohttp): the lowest latency for a lone
            agent. ``False``: every request goes through aiohttp.
        transport: An httpx transport to use instead of the network (tests).
        replica_cooldown: Seconds a replica that failed at the connection level stays out of
            rotation (only with several replicas).
    """

    backend = "openai"

    def __init__(
        self,
        model: str = "",
        *,
        base_url: str | Sequence[str] | None = None,
        api_key: str | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        timeout: float = 600.0,
        connect_timeout: float = 30.0,
        max_retries: int = 3,
        retry_backoff: float = 0.5,
        return_token_ids: bool | Literal["auto"] = "auto",
        logprobs: bool | Literal["auto"] = "auto",
        text_tool_calls: bool = True,
        forward_metadata: bool = False,
        sampling_defaults: Mapping[str, Any] | None = None,
        sampling_overrides: Mapping[str, Any] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        sync_single: bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
        replica_cooldown: float = 30.0,
    ) -> None:
        base_url = base_url or os.environ.get("OPENAI_BASE_URL")
        urls = [base_url] if isinstance(base_url, str) else list(base_url or [])
        if not urls or not all(isinstance(u, str) and u for u in urls):
            raise ValueError(
                "the openai backend needs the server's base URL: OpenAIPolicy(model, base_url='http://host:port/v1') "
                "(or set OPENAI_BASE_URL)"
            )
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        for name, value in (("return_token_ids", return_token_ids), ("logprobs", logprobs)):
            if value not in (True, False, "auto"):
                raise ValueError(f"{name} must be True, False or 'auto', got {value!r}")
        self.base_urls = [u.rstrip("/") for u in urls]
        self.base_url = self.base_urls[0]
        self.replica_cooldown = float(replica_cooldown)
        #: When each replica comes back into rotation (``time.monotonic()``; 0: in rotation).
        self._down_until = [0.0] * len(self.base_urls)
        self.model = "" if model in (None, "auto") else str(model)
        self.concurrency = int(concurrency)
        self.max_retries = int(max_retries)
        self.retry_backoff = float(retry_backoff)
        self.text_tool_calls = text_tool_calls
        self.forward_metadata = forward_metadata
        self.sampling_defaults = dict(sampling_defaults or {})
        self.sampling_overrides = dict(sampling_overrides or {})
        self.extra_body = dict(extra_body or {})
        # Current state of the two optional fields; "auto" turns into False on first rejection.
        self._ask_token_ids: bool | str = return_token_ids
        self._ask_logprobs: bool | str = logprobs
        self._token_ids_auto = return_token_ids == "auto"
        self._logprobs_auto = logprobs == "auto"

        api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self._headers = {"content-type": "application/json", **dict(headers or {})}
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"
        self._replicas = [
            pick_transport(
                url,
                self._headers,
                concurrency=self.concurrency,
                timeout=timeout,
                connect_timeout=connect_timeout,
                transport=transport,
            )
            for url in self.base_urls
        ]
        # A batch of one on plain http goes out from the caller's thread on a blocking socket:
        # handing it to the I/O thread and back is most of a small request's latency.
        self._sync_replicas: list[SyncHTTP] | None = None
        if sync_single and all(isinstance(r, AiohttpTransport) and env_proxy(r.base_url) is None for r in self._replicas):
            self._sync_replicas = [
                SyncHTTP(url, self._headers, timeout=timeout, connect_timeout=connect_timeout)
                for url in self.base_urls
            ]
        self._sync_budget = threading.BoundedSemaphore(self.concurrency)
        self._counter_lock = threading.Lock()
        self._io = BackgroundLoop(name="agentgym-openai-policy")
        # A request takes a free slot (LIFO: a lone caller keeps reusing one warm connection);
        # slots bound the requests in flight to ``concurrency``.
        self._slots: asyncio.LifoQueue[int] | None = None
        self._model_lock: asyncio.Lock | None = None
        self._closed = False
        # Counters (read them for logs/benchmarks): requests sent, retries made, in flight now.
        self.requests_sent = 0
        self.retries = 0
        self.in_flight = 0
        self.max_in_flight = 0

    # ------------------------------------------------------------------ public API

    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        """One completion per request, in order; the batch is sent concurrently.

        Raises :class:`PolicyBackendError` if any request failed after retries (once all have
        finished; its ``completions`` holds the ones that succeeded).

        A batch of one is sent from the calling thread (the fastest path for a lone agent; see
        ``sync_single``); such calls have their own budget of ``concurrency``.
        """
        if self._closed:
            raise RuntimeError("this OpenAIPolicy is closed")
        if not requests:
            return []
        if len(requests) == 1 and self._sync_replicas is not None and self.model:
            try:
                return [self._one_sync(requests[0])]
            except PolicyBackendError as exc:
                raise PolicyBackendError(
                    f"1 of 1 requests to {self.base_url} failed; first (request 0): {exc}",
                    status=exc.status,
                    body=exc.body,
                    retryable=exc.retryable,
                    attempts=exc.attempts,
                    failures={0: exc},
                    completions=[None],
                ) from exc
        return self._io.submit(self._generate(list(requests))).result()

    def submit(self, request: ChatRequest) -> Future[Completion]:
        """Send ``request`` now, from the policy's event loop; the future resolves to its
        completion when its answer arrives, whatever else is in flight (or to the
        :class:`PolicyBackendError` it failed with after retries). See
        :class:`~agentgym_lightning.policies.base.SchedulingPolicy`."""
        if self._closed:
            raise RuntimeError("this OpenAIPolicy is closed")
        return self._io.submit(self._submit_one(request))

    async def _submit_one(self, request: ChatRequest) -> Completion:
        self._ensure_slots()
        if not self.model:
            await self._detect_model()
        return await self._one(request)

    async def agenerate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        """:meth:`generate` for async callers (runs on the policy's own loop, awaited from yours)."""
        if self._closed:
            raise RuntimeError("this OpenAIPolicy is closed")
        if not requests:
            return []
        return await asyncio.wrap_future(self._io.submit(self._generate(list(requests))))

    def close(self) -> None:
        """Close the connection pool and stop the I/O thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._io.submit(self._close_replicas()).result(timeout=10)
        except Exception:  # noqa: BLE001 - best effort on shutdown
            log.debug("closing the openai policy's connections failed", exc_info=True)
        self._io.close()
        for sync in self._sync_replicas or []:
            sync.close()

    def __repr__(self) -> str:
        urls = self.base_url if len(self.base_urls) == 1 else self.base_urls
        return f"OpenAIPolicy(model={self.model!r}, base_url={urls!r}, concurrency={self.concurrency})"

    @property
    def _http(self) -> Any:
        """The first replica's transport."""
        return self._replicas[0]

    # ------------------------------------------------------------------ replicas

    async def _close_replicas(self) -> None:
        await asyncio.gather(*(r.aclose() for r in self._replicas), return_exceptions=True)

    @property
    def replicas_in_rotation(self) -> list[str]:
        """The base URLs requests are sent to now (a failed replica is out for a while)."""
        now = time.monotonic()
        return [url for url, until in zip(self.base_urls, self._down_until) if until <= now]

    def _replica_for(self, request: ChatRequest | None) -> int:
        """The replica of ``request``'s episode: the highest rendezvous score among the replicas
        in rotation (all of them when none is)."""
        if len(self.base_urls) == 1:
            return 0
        if request is None:
            key = ""
        else:
            key = request.metadata.get(EPISODE_KEY) or json.dumps(request.messages[:2], sort_keys=True, default=str)
        now = time.monotonic()
        alive = [i for i, until in enumerate(self._down_until) if until <= now] or list(range(len(self.base_urls)))
        return max(alive, key=lambda i: zlib.crc32(f"{i}:{key}".encode()))

    def _fail_over(self, replica: int, failure: TransportFailure, request: ChatRequest | None) -> int | None:
        """Take ``replica`` out of rotation after a connection-level failure; the replica to
        try next, or None when no other one is in rotation."""
        if len(self.base_urls) == 1:
            return None
        if self._down_until[replica] <= time.monotonic():
            log.warning(
                "openai policy: replica %s failed (%s); out of rotation for %.0f s",
                self.base_urls[replica],
                failure,
                self.replica_cooldown,
            )
        self._down_until[replica] = time.monotonic() + self.replica_cooldown
        other = self._replica_for(request)
        return None if other == replica else other

    # ------------------------------------------------------------------ internals (on the I/O loop)

    def _ensure_slots(self) -> asyncio.LifoQueue[int]:
        if self._slots is None:
            self._slots = asyncio.LifoQueue()
            for slot in reversed(range(self.concurrency)):  # slot 0 on top
                self._slots.put_nowait(slot)
            self._model_lock = asyncio.Lock()
        return self._slots

    async def _generate(self, requests: list[ChatRequest]) -> list[Completion]:
        self._ensure_slots()
        if not self.model:
            await self._detect_model()
        results = await asyncio.gather(*(self._one(r) for r in requests), return_exceptions=True)
        failures: dict[int, PolicyBackendError] = {}
        completions: list[Completion | None] = []
        for i, result in enumerate(results):
            if isinstance(result, BaseException):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                failures[i] = (
                    result
                    if isinstance(result, PolicyBackendError)
                    else PolicyBackendError(f"request {i}: {type(result).__name__}: {result}")
                )
                completions.append(None)
            else:
                completions.append(result)
        if failures:
            first_index, first = next(iter(failures.items()))
            raise PolicyBackendError(
                f"{len(failures)} of {len(requests)} requests to {self.base_url} failed; "
                f"first (request {first_index}): {first}",
                status=first.status,
                body=first.body,
                retryable=first.retryable,
                attempts=first.attempts,
                failures=failures,
                completions=completions,
            )
        return [c for c in completions if c is not None]

    async def _detect_model(self) -> None:
        assert self._model_lock is not None
        async with self._model_lock:
            if self.model:
                return
            slots = self._ensure_slots()
            slot = await slots.get()
            try:
                data = await self._send(slot, "GET", "/models", None, None)
            finally:
                slots.put_nowait(slot)
            models = data.get("data") if isinstance(data, Mapping) else None
            if not models or not isinstance(models, list) or not isinstance(models[0], Mapping) or not models[0].get("id"):
                raise PolicyBackendError(
                    f"{self.base_url}/models lists no model; pass the model name: OpenAIPolicy('<model>', base_url=...)"
                )
            self.model = str(models[0]["id"])
            log.info("openai policy: using model %r served at %s", self.model, self.base_url)

    def build_body(self, request: ChatRequest) -> dict[str, Any]:
        """The JSON body sent upstream for ``request`` (public for inspection and tests)."""
        body = request.to_openai()
        for key in _DROPPED_KEYS:
            body.pop(key, None)
        if not self.forward_metadata:
            body.pop("metadata", None)
        for key, value in self.sampling_defaults.items():
            if body.get(key) is None:
                body[key] = value
        body.update(self.sampling_overrides)
        if self.model:
            body["model"] = self.model
        adapter = request.metadata.get(ADAPTER_KEY)
        if adapter and adapter != BASE_ADAPTER:
            # The adapter this call is routed to (lora_per_agent), named as the model: how an
            # OpenAI-compatible server (vllm serve --enable-lora, our PolicyServer) selects one.
            body["model"] = adapter
        if self._ask_logprobs:
            body["logprobs"] = True
        if self._ask_token_ids:
            body["return_token_ids"] = True
        body.update(self.extra_body)
        if request.prompt is not None:
            # A legacy completion (raw text, no chat template): the server's /completions,
            # whose logprobs option is a count of alternatives, not a flag.
            del body["messages"]
            body["prompt"] = request.prompt
            if body.get("logprobs") is True:
                body["logprobs"] = 0
        return body

    @staticmethod
    def _path(request: ChatRequest) -> str:
        return "/completions" if request.prompt is not None else "/chat/completions"

    def _enter(self) -> None:
        with self._counter_lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def _leave(self) -> None:
        with self._counter_lock:
            self.in_flight -= 1

    async def _one(self, request: ChatRequest) -> Completion:
        slots = self._ensure_slots()
        slot = await slots.get()
        self._enter()
        try:
            while True:
                body = self.build_body(request)
                try:
                    data = await self._send(slot, "POST", self._path(request), body, request)
                except PolicyBackendError as exc:
                    if exc.status == 400 and self._drop_rejected_field(exc, body):
                        continue  # resend without the field the server rejected
                    raise
                return self._completion(request, data)
        finally:
            self._leave()
            slots.put_nowait(slot)

    def _one_sync(self, request: ChatRequest) -> Completion:
        """:meth:`_one` on the caller's thread, over :class:`SyncHTTP`."""
        with self._sync_budget:
            self._enter()
            try:
                while True:
                    body = self.build_body(request)
                    try:
                        data = self._send_sync("POST", self._path(request), body, request)
                    except PolicyBackendError as exc:
                        if exc.status == 400 and self._drop_rejected_field(exc, body):
                            continue
                        raise
                    return self._completion(request, data)
            finally:
                self._leave()

    def _drop_rejected_field(self, exc: PolicyBackendError, body: Mapping[str, Any]) -> bool:
        """On a 400 naming an optional field that ``body`` carried under ``"auto"``: stop asking
        for it (for good) and return True, so the request is sent again without it."""
        message = (exc.body or str(exc)).lower()
        dropped = False
        if self._token_ids_auto and body.get("return_token_ids") and "return_token_ids" in message:
            if self._ask_token_ids:
                log.info("openai policy: %s rejects return_token_ids; token ids will be unavailable", self.base_url)
            self._ask_token_ids = False
            dropped = True
        if self._logprobs_auto and body.get("logprobs") and "logprobs" in message.replace("top_logprobs", ""):
            if self._ask_logprobs:
                log.info("openai policy: %s rejects logprobs; logprobs will be unavailable", self.base_url)
            self._ask_logprobs = False
            dropped = True
        return dropped

    def _attempts(self, method: str, path: str, request: ChatRequest | None) -> _Attempts:
        """The retry and fail-over decisions of one request, made in one place for both faces
        (:meth:`_send` on the I/O loop, :meth:`_send_sync` on the caller's thread), which only do
        the waiting and the sending. It yields ``(delay, replica)``: wait ``delay`` seconds
        (``None``: not at all), then send to ``replica`` and send back in what came of it (a
        response, or the :class:`TransportFailure`). It returns the decoded JSON response, or
        raises :class:`PolicyBackendError` once the request has failed for good."""
        attempt = 0
        delay: float | None = None
        replica = self._replica_for(request)
        while True:
            attempt += 1
            outcome = yield delay, replica
            delay = None
            if isinstance(outcome, TransportFailure):
                other = self._fail_over(replica, outcome, request)
                if other is not None:
                    replica, attempt = other, attempt - 1  # another replica: not a retry
                    continue
            done, value = self._judge(method, self.base_urls[replica] + path, attempt, outcome)
            if done:
                return value
            delay = value

    async def _send(
        self, slot: int, method: str, path: str, body: dict[str, Any] | None, request: ChatRequest | None
    ) -> Any:
        """One request with retries (and fail-over across replicas: :meth:`_attempts`); the
        decoded JSON response or :class:`PolicyBackendError`."""
        content = None if body is None else json.dumps(body).encode()
        attempts = self._attempts(method, path, request)
        delay, replica = next(attempts)
        while True:
            if delay is not None:
                await asyncio.sleep(delay)
            try:
                outcome: Any = await self._replicas[replica].request(slot, method, path, content)
            except TransportFailure as exc:
                outcome = exc
            try:
                delay, replica = attempts.send(outcome)
            except StopIteration as done:
                return done.value

    def _send_sync(self, method: str, path: str, body: dict[str, Any] | None, request: ChatRequest | None) -> Any:
        """:meth:`_send` on the caller's thread."""
        assert self._sync_replicas is not None
        content = None if body is None else json.dumps(body).encode()
        attempts = self._attempts(method, path, request)
        delay, replica = next(attempts)
        while True:
            if delay is not None:
                time.sleep(delay)
            try:
                outcome: Any = self._sync_replicas[replica].request(method, path, content)
            except TransportFailure as exc:
                outcome = exc
            try:
                delay, replica = attempts.send(outcome)
            except StopIteration as done:
                return done.value

    def _judge(self, method: str, url: str, attempt: int, outcome: Any) -> tuple[bool, Any]:
        """What one attempt's outcome (a response or a :class:`TransportFailure`) means:
        ``(True, json)`` for success, ``(False, delay)`` to retry after ``delay`` seconds;
        raises :class:`PolicyBackendError` when the request has failed for good."""
        with self._counter_lock:
            self.requests_sent += 1
        status: int | None = None
        text: str | None = None
        retry_after: float | None = None
        if isinstance(outcome, TransportFailure):  # connect/read/write errors, time-outs, not HTTP
            retryable = True
            problem = str(outcome)
        else:
            status, headers, raw = outcome
            if status < 400:
                try:
                    data = json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    snippet = _snippet(raw.decode("utf-8", "replace"))
                    raise PolicyBackendError(
                        f"{method} {url} answered {status} with a body that is not JSON: {snippet[:300]!r}",
                        status=status,
                        body=snippet,
                        attempts=attempt,
                    ) from exc
                if isinstance(data, dict) and VERSION_HEADER in headers:
                    # The weights version that answered (a generator server's stamp; the
                    # vllm-server backend checks it): carried with the body to _completion.
                    data[VERSION_HEADER] = headers[VERSION_HEADER]
                return True, data
            text = _snippet(raw.decode("utf-8", "replace"))
            retryable = status in RETRY_STATUSES
            retry_after = _retry_after(headers.get("retry-after"))
            problem = f"HTTP {status}: {_error_message(text)}"
        if not retryable or attempt > self.max_retries:
            tried = f" after {attempt} attempts" if attempt > 1 else ""
            raise PolicyBackendError(
                f"{method} {url} failed{tried}: {problem}",
                status=status,
                body=text,
                retryable=retryable,
                attempts=attempt,
            )
        delay = min(30.0, self.retry_backoff * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)
        if retry_after is not None:
            delay = max(delay, retry_after)
        with self._counter_lock:
            self.retries += 1
        log.warning("openai policy: %s %s: %s; retry %d/%d in %.2f s", method, url, problem, attempt, self.max_retries, delay)
        return False, delay

    def _completion(self, request: ChatRequest, data: Any) -> Completion:
        """Turn a ``chat.completion`` (or legacy ``text_completion``) response into a
        :class:`Completion` (ids only if given)."""
        choices = data.get("choices") if isinstance(data, Mapping) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
            raise PolicyBackendError(
                f"{self.base_url}{self._path(request)} answered without choices: {_snippet(json.dumps(data), 300)}",
                body=_snippet(json.dumps(data)),
            )
        choice = choices[0]
        message = choice.get("message") or {"content": choice.get("text")}
        text = message.get("content") or ""
        if not isinstance(text, str):  # content parts
            text = "".join(p.get("text", "") for p in text if isinstance(p, Mapping))
        tool_calls: list[ToolCall] = []
        tool_call_errors: list[str] = []
        for tc in message.get("tool_calls") or []:
            try:
                tool_calls.append(ToolCall.from_openai(tc))
            except ValueError as exc:  # the server's malformed call: an AIR signal, not a crash
                tool_call_errors.append(str(exc))
        finish_reason = str(choice.get("finish_reason") or "stop")
        if not tool_calls and self.text_tool_calls and request.tools and "<tool_call>" in text:
            from agentgym_lightning.policies.tool_calls import parse_tool_calls

            parsed = parse_tool_calls(text)
            if parsed.tool_calls:
                text, tool_calls, finish_reason = parsed.content, parsed.tool_calls, "tool_calls"

        prompt_ids = _int_list(data.get("prompt_token_ids"))
        if prompt_ids is None:
            prompt_ids = _int_list(choice.get("prompt_token_ids"))  # some servers put it per choice
        completion_ids = _int_list(choice.get("token_ids"))
        logprobs = _token_logprobs(choice)
        if completion_ids is not None and logprobs is not None and len(completion_ids) != len(logprobs):
            log.warning(
                "openai policy: the server returned %d token ids but %d logprobs; dropping the logprobs",
                len(completion_ids),
                len(logprobs),
            )
            logprobs = None
        return Completion(
            text=text,
            tool_calls=tool_calls,
            finish_reason=finish_reason,
            prompt_token_ids=prompt_ids,
            completion_token_ids=completion_ids,
            logprobs=logprobs,
            model=str(data.get("model") or self.model or "") or None,
            tool_call_errors=tool_call_errors,
            policy_version=_policy_version(data.get("policy_version")),
        )


def _policy_version(value: Any) -> int | None:
    """The ``policy_version`` our policy server stamps on an answer (the trainer's generator
    served to its Ray workers), or ``None`` when absent or not a version."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` header in seconds, if numeric and at most 60 s."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if 0 <= seconds <= 60 else None
