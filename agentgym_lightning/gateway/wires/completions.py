"""The legacy Completions wire (``POST .../v1/completions``): a raw ``prompt``, no chat template.

The step's request records the prompt (``ChatRequest.prompt``) and the policy generates from that
text as it is (``messages`` holds it as one user message, for whatever reads only conversations).
A string or a list of one string; ``max_tokens``, ``temperature``, ``top_p``, ``stop``, ``seed``,
the penalties, ``logprobs`` (any number: the sampled token's logprob is what we carry) and
``stream`` (with ``stream_options.include_usage``). ``echo``, ``n`` > 1, ``best_of`` > 1,
``suffix`` and token-id prompts are refused with a 400. Token ids ride along as in chat
(``prompt_token_ids``; ``token_ids`` on the choice).
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from openai.types.completion_create_params import CompletionCreateParamsBase

from agentgym_lightning.gateway.validation import check_params
from agentgym_lightning.gateway.wires.base import Wire, sse, usage_counts
from agentgym_lightning.llm import ChatRequest, Completion, GatewayError

if TYPE_CHECKING:
    from agentgym_lightning.episode import Episode, PendingCall

__all__ = ["CompletionsWire"]

_SAMPLING = (
    "max_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "stream",
    "metadata",
)


def _prompt(data: dict[str, Any]) -> str:
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise GatewayError(
            400,
            "'prompt' must be a string (or a list of one string): one prompt per call, as text (token-id prompts are not served)",
        )
    return prompt


class CompletionsWire(Wire):
    name = "completions"
    path = "completions"

    def parse(self, data: Any, episode: Episode, content_part_types: Collection[str]) -> ChatRequest:
        check_params({"prompt": "", **data}, CompletionCreateParamsBase)
        if data.get("echo"):
            raise GatewayError(400, "'echo' is not served: the prompt is yours already; leave it out")
        for key in ("n", "best_of"):
            if data.get(key) not in (None, 1):
                raise GatewayError(400, f"'{key}' > 1 is not served: make separate calls (each is one step)")
        if data.get("suffix"):
            raise GatewayError(400, "'suffix' (insertion) is not served; leave it out")
        prompt = _prompt(data)
        body: dict[str, Any] = {"model": data.get("model") or "", "messages": [{"role": "user", "content": prompt}]}
        body.update({k: data[k] for k in _SAMPLING if data.get(k) is not None})
        if data.get("logprobs") is not None:
            body["logprobs"] = True
        if data.get("stream_options") is not None:
            body["stream_options"] = data["stream_options"]
        try:
            request = ChatRequest.from_openai(body)
        except ValueError as exc:
            raise GatewayError(400, str(exc)) from None
        request.wire, request.prompt = self.name, prompt
        return request

    def _choice(self, call: PendingCall, completion: Completion) -> dict[str, Any]:
        logprobs = None
        if call.request.sampling.logprobs and completion.logprobs is not None:
            ids = completion.completion_token_ids or []
            # Token ids as their own text, as the chat wire gives them.
            logprobs = {
                "tokens": [str(t) for t in ids],
                "token_logprobs": completion.logprobs,
                "top_logprobs": None,
                "text_offset": None,
            }
        choice: dict[str, Any] = {
            "index": 0,
            "text": completion.text,
            "logprobs": logprobs,
            "finish_reason": "length" if completion.finish_reason == "length" else "stop",
        }
        if completion.completion_token_ids is not None:
            choice["token_ids"] = completion.completion_token_ids
        return choice

    def _base(self, call: PendingCall, completion: Completion) -> dict[str, Any]:
        return {
            "id": f"cmpl-{call.call_id}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": completion.model or call.request.model or "policy",
        }

    @staticmethod
    def _usage(completion: Completion) -> dict[str, int]:
        p, c = usage_counts(completion)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def body(self, call: PendingCall, completion: Completion) -> dict[str, Any]:
        body = {
            **self._base(call, completion),
            "choices": [self._choice(call, completion)],
            "usage": self._usage(completion),
        }
        if completion.prompt_token_ids is not None:
            body["prompt_token_ids"] = completion.prompt_token_ids
        return body

    def events(self, call: PendingCall, completion: Completion) -> list[bytes]:
        base, last = self._base(call, completion), self._choice(call, completion)
        chunks = []
        if completion.text:
            chunks.append(
                {**base, "choices": [{"index": 0, "text": completion.text, "logprobs": None, "finish_reason": None}]}
            )
        chunks.append({**base, "choices": [{**last, "text": ""}]})
        if (call.request.extra.get("stream_options") or {}).get("include_usage"):
            chunks.append({**base, "choices": [], "usage": self._usage(completion)})
        return [sse(None, c) for c in chunks] + [b"data: [DONE]\n\n"]
