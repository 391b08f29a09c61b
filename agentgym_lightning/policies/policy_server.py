"""Any policy as an OpenAI-compatible server: generation as a service for rollout workers.

The trainer's own generator (the ``hf`` model it trains in place) is served this way to its Ray
rollout workers, whose ``openai`` backend points at it: every worker's pending calls arrive here
concurrently and are answered in batches by one ``policy.generate``, with the token ids and
logprobs in vLLM's extension fields (``prompt_token_ids``, ``choices[0].token_ids``) so the
workers' trajectories are token-exact. Requests that arrive together are batched: the oldest
waits at most ``max_batch_wait`` seconds for company. A request the policy rejects gets a 400; a
policy that fails altogether answers 503 (the client's retries and then ``infra_failed``).

It also takes the weight sync of the ``vllm-server`` backend (the same routes ``vllm serve``
offers, :mod:`~agentgym_lightning.policies.served_weights`): ``POST /collective_rpc`` with the
method ``agentgym_reload_weights`` loads the safetensors of a shared folder into the policy's
model (an ``hf`` policy's own, or through ``load_weights``), between batches;
``/reset_prefix_cache`` has nothing to drop (``hf`` caches prefixes within a batch); and every
answer carries the weights version (``/agentgym/weights_version``).

::

    with PolicyServer(policy) as server:           # 127.0.0.1, a free port
        OpenAIPolicy("policy", base_url=server.base_url)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import queue
import threading
import time
from typing import Any

from agentgym_lightning.gateway.auth import check_bearer, server_token
from agentgym_lightning.gateway.openai_wire import (
    ERROR_HEADERS,
    GatewayError,
    completion_body,
    error_body,
    models_body,
    new_call_id,
)
from agentgym_lightning.llm import ChatRequest
from agentgym_lightning.policies.base import ModelSharingPolicy, WeightLoadingPolicy
from agentgym_lightning.policies.isolation import FailureIsolator, PolicyDown
from agentgym_lightning.policies.served_weights import RELOAD_METHOD, WeightsVersionMiddleware, read_weights

__all__ = ["PolicyServer"]

log = logging.getLogger(__name__)


class PolicyServer:
    """Serves ``policy`` at ``{url}/v1/chat/completions`` (see the module docstring).

    Args:
        policy: Any :class:`~agentgym_lightning.policies.Policy` or ``fn(requests) -> completions``.
        host: Address to bind.
        port: Port (0: a free one).
        token: Bearer token clients must send. Off loopback one is required: if none is given
            there, one is generated (read it from :attr:`token`); on loopback ``None`` checks none.
        model_name: The model name ``/v1/models`` lists.
        max_batch_wait: Seconds the oldest request waits for others to join its batch.
        max_batch_size: Most requests per ``generate`` (``None``: all that are waiting).
    """

    def __init__(
        self,
        policy: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        model_name: str = "policy",
        max_batch_wait: float = 0.005,
        max_batch_size: int | None = None,
    ) -> None:
        self.token = server_token(host, token)
        self.model_name = model_name
        self.max_batch_wait = max_batch_wait
        self.max_batch_size = max_batch_size
        self.policy = policy
        self._batcher = FailureIsolator(policy)
        # A weight reload waits for the batch being generated, and the next batch for it.
        self._policy_lock = threading.Lock()
        self._queue: queue.SimpleQueue[tuple[ChatRequest, concurrent.futures.Future[Any]] | None] = queue.SimpleQueue()
        self._host, self._port = host, port
        self._server: Any = None
        self._worker: threading.Thread | None = None
        #: Requests answered and ``generate`` calls made (for logs and benchmarks).
        self.requests = 0
        self.batches = 0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> PolicyServer:
        if self._server is None:
            from agentgym_lightning.gateway.server import ThreadedServer

            self._worker = threading.Thread(target=self._generate_loop, name="agentgym-policy-server", daemon=True)
            self._worker.start()
            self._server = ThreadedServer(self._app(), self._host, self._port, name="agentgym-policy-http")
            self._server.start()
        return self

    @property
    def url(self) -> str:
        self.start()
        return self._server.url

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (``.../v1``)."""
        return f"{self.url}/v1"

    def close(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join(30)
            self._worker = None

    def __enter__(self) -> PolicyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ batching (its own thread)

    def _generate_loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            deadline = time.monotonic() + self.max_batch_wait
            while self.max_batch_size is None or len(batch) < self.max_batch_size:
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)  # stop after this batch
                    break
                batch.append(item)
            self.batches += 1
            self.requests += len(batch)
            try:
                with self._policy_lock:
                    answers = self._batcher.answer([request for request, _ in batch])
            except PolicyDown as exc:
                error = GatewayError(503, f"the policy failed: {exc.__cause__ or exc}", "server_error")
                for _, fut in batch:
                    fut.set_result(error)
                continue
            except BaseException as exc:  # noqa: BLE001 - reported to every waiting client
                log.exception("the policy server's generate failed")
                for _, fut in batch:
                    fut.set_result(GatewayError(500, f"{type(exc).__name__}: {exc}", "server_error"))
                continue
            for (_, fut), answer in zip(batch, answers):
                fut.set_result(answer)

    # ------------------------------------------------------------------ weight sync

    def reload_weights(self, weights_path: str) -> None:
        """Replace the policy's weights with the safetensors in ``weights_path`` (what ``POST
        /collective_rpc`` with ``agentgym_reload_weights`` does), between two batches."""
        tensors = read_weights(weights_path)
        with self._policy_lock:
            if isinstance(self.policy, WeightLoadingPolicy):
                self.policy.load_weights(tensors.items())
            elif isinstance(self.policy, ModelSharingPolicy):
                _load_into(self.policy.hf_model, tensors)
            else:
                raise TypeError(f"the {getattr(self.policy, 'backend', type(self.policy).__name__)!r} policy holds no weights to replace")

    # ------------------------------------------------------------------ HTTP

    def _app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse, Response
        from starlette.routing import Route

        def check(request: Request) -> None:
            check_bearer(request.headers.get("authorization"), self.token)

        def error(exc: GatewayError) -> Response:
            return JSONResponse(error_body(exc.status, exc.message, exc.code), status_code=exc.status, headers=ERROR_HEADERS)

        async def chat(request: Request) -> Response:
            try:
                check(request)
                try:
                    body = json.loads(await request.body() or b"null")
                    chat_request = ChatRequest.from_openai(body)
                except (json.JSONDecodeError, ValueError) as exc:
                    raise GatewayError(400, str(exc)) from None
                if chat_request.stream:
                    raise GatewayError(400, "stream is not supported by the policy server")
                fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
                self._queue.put((chat_request, fut))
                answer = await asyncio.wrap_future(fut)
                if isinstance(answer, GatewayError):
                    raise answer
                return Response(
                    json.dumps(completion_body(chat_request, answer, new_call_id())), media_type="application/json"
                )
            except GatewayError as exc:
                return error(exc)

        async def collective_rpc(request: Request) -> Response:
            try:
                check(request)
                try:
                    body = json.loads(await request.body() or b"null")
                    method, kwargs = body["method"], dict(body.get("kwargs") or {})
                except (json.JSONDecodeError, ValueError, KeyError, TypeError):
                    raise GatewayError(400, 'expected {"method": ..., "kwargs": {...}}') from None
                if method != RELOAD_METHOD or set(kwargs) != {"weights_path"}:
                    raise GatewayError(400, f"the policy server runs only {RELOAD_METHOD}(weights_path=...)")
                try:
                    await asyncio.to_thread(self.reload_weights, str(kwargs["weights_path"]))
                except (OSError, TypeError, ValueError, RuntimeError) as exc:
                    raise GatewayError(400, f"{type(exc).__name__}: {exc}") from None
                return JSONResponse({"results": [True]})
            except GatewayError as exc:
                return error(exc)

        async def reset_prefix_cache(request: Request) -> Response:
            try:
                check(request)
            except GatewayError as exc:
                return error(exc)
            return JSONResponse({"success": True})

        async def models(request: Request) -> Response:
            try:
                check(request)
            except GatewayError as exc:
                return error(exc)
            return JSONResponse(models_body(self.model_name))

        from starlette.middleware import Middleware

        return Starlette(
            routes=[
                Route("/v1/chat/completions", chat, methods=["POST"]),
                Route("/v1/models", models, methods=["GET"]),
                Route("/collective_rpc", collective_rpc, methods=["POST"]),
                Route("/reset_prefix_cache", reset_prefix_cache, methods=["POST"]),
            ],
            middleware=[Middleware(WeightsVersionMiddleware, token=self.token or "")],
        )


def _load_into(model: Any, tensors: dict[str, Any]) -> None:
    """Copy ``tensors`` (a whole checkpoint) into ``model``'s parameters in place. Only a weight
    tied to another one (the LM head to the embeddings) may be absent: it follows its twin."""
    import torch

    owned = {name for name, _ in model.named_parameters()}  # a tied weight is listed once
    with torch.no_grad():
        result = model.load_state_dict(tensors, strict=False)
    missing = [name for name in result.missing_keys if name in owned]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"the pushed weights do not match the served model: missing {missing[:5]}, unexpected {result.unexpected_keys[:5]}"
        )
