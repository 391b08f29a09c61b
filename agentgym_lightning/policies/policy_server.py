"""Any policy as an OpenAI-compatible server: generation as a service for rollout workers.

The trainer's own generator (the ``hf`` model it trains in place) is served this way to its Ray
rollout workers, whose ``openai`` backend points at it: every worker's pending calls arrive here
concurrently and are answered in batches by one ``policy.generate``, with the token ids and
logprobs in vLLM's extension fields (``prompt_token_ids``, ``choices[0].token_ids``) so the
workers' trajectories are token-exact. Requests that arrive together are batched by a
:class:`~agentgym_lightning.policies.batching.BatchingPolicy` (the one batching path): the oldest
waits at most ``max_batch_wait`` seconds for company (flat: no adaptive wait). A request the policy
rejects gets a 400; a policy that fails altogether answers 503 (the client's retries and then
``infra_failed``).

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
import json
import threading
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
from agentgym_lightning.policies.batching import BatchingPolicy
from agentgym_lightning.policies.isolation import PolicyDown
from agentgym_lightning.policies.served_weights import RELOAD_METHOD, WeightsVersionMiddleware, read_weights

__all__ = ["PolicyServer"]


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

    The policy is always answered through ``generate``, in batches, even when it could take calls
    one at a time (``submit``): served answers stay those of the batches it has always made.
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
        # A weight reload waits for the batch being generated, and the next batch for it.
        self._policy_lock = threading.Lock()
        self._batching = self._new_batching()
        self._host, self._port = host, port
        self._server: Any = None

    def _new_batching(self) -> BatchingPolicy:
        return BatchingPolicy(
            self.policy,
            max_batch_size=self.max_batch_size,
            max_batch_wait=self.max_batch_wait,
            wait_fraction=None,
            lock=self._policy_lock,
            name="agentgym-policy-server",
        )

    @property
    def requests(self) -> int:
        """Requests handed to ``generate`` (for logs and benchmarks)."""
        return self._batching.requests

    @property
    def batches(self) -> int:
        """``generate`` calls made (for logs and benchmarks)."""
        return self._batching.batches

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> PolicyServer:
        if self._server is None:
            from agentgym_lightning.gateway.server import ThreadedServer

            if self._batching.closed:  # started again after close()
                self._batching = self._new_batching()
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
        self._batching.close(timeout=30)  # the requests already queued are answered first

    def __enter__(self) -> PolicyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def _answer(self, request: ChatRequest) -> Any:
        """``request``'s completion from the batches; a :class:`GatewayError` to send back when it
        failed: its own 400, 503 when the policy is down, 500 for anything else."""
        try:
            return await asyncio.wrap_future(self._batching.submit(request))
        except GatewayError:
            raise  # the request's own failure (the policy rejected it): a 400
        except PolicyDown as exc:
            raise GatewayError(503, f"the policy failed: {exc.__cause__ or exc}", "server_error") from None
        except asyncio.CancelledError:
            raise  # the client went away
        except BaseException as exc:  # noqa: BLE001 - reported to the client (and logged by the batching)
            raise GatewayError(500, f"{type(exc).__name__}: {exc}", "server_error") from None

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
                answer = await self._answer(chat_request)
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
