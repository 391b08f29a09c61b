"""The OpenAI wire format of our answers: chat completions, their streamed chunks, and errors.

Shared by the HTTP app and the in-process transport so both speak byte-for-byte the same.
"""

from __future__ import annotations

import json
import time
from typing import Any

# GatewayError and new_call_id live with the data model (an episode refuses calls with it); they
# are part of the wire format too, so this module exports them.
from agentgym_lightning.llm import ChatRequest, Completion, GatewayError, new_call_id

__all__ = [
    "GatewayError",
    "new_call_id",
    "completion_body",
    "completion_sse",
    "error_body",
    "assistant_message",
    "internal_error",
    "models_body",
    "ERROR_HEADERS",
]

#: Tells the openai client not to retry: a failed call is a signal for the agent, and a retry
#: against a closed episode only delays the agent's exit.
ERROR_HEADERS = {"x-should-retry": "false"}


def internal_error(exc: BaseException) -> GatewayError:
    """The 500 for an unexpected failure inside the gateway (its traceback goes to the log)."""
    return GatewayError(
        500, f"the gateway failed on this request ({type(exc).__name__}: {exc}); this is a bug, please report it", "server_error"
    )


def error_body(status: int, message: str, code: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": code, "code": status, "param": None}}


def models_body(model: str) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "agentgym-lightning"}]}


def assistant_message(completion: Completion) -> dict[str, Any]:
    """The answer as the chat ``assistant`` message an agent appends to its conversation."""
    msg: dict[str, Any] = {"role": "assistant", "content": completion.text}
    if completion.tool_calls:
        msg["tool_calls"] = [tc.to_openai() for tc in completion.tool_calls]
        # OpenAI sends null content alongside tool calls when there is no text.
        if not completion.text:
            msg["content"] = None
    return msg


def _usage(completion: Completion) -> dict[str, int]:
    # Always an object: clients read usage.prompt_tokens unguarded (smolagents crashed on null).
    # Counts the ids do not give (an API backend that returned none) are 0.
    p, c = len(completion.prompt_token_ids or ()), len(completion.completion_token_ids or ())
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _logprobs(request: ChatRequest, completion: Completion) -> dict[str, Any] | None:
    if not request.sampling.logprobs or completion.logprobs is None:
        return None
    ids = completion.completion_token_ids or []
    # We carry ids, not token strings; the id is given as its own text so the field stays valid.
    return {
        "content": [
            {"token": str(tok), "logprob": lp, "bytes": None, "top_logprobs": []} for tok, lp in zip(ids, completion.logprobs)
        ]
    }


def completion_body(request: ChatRequest, completion: Completion, call_id: str) -> dict[str, Any]:
    """A ``chat.completion`` object; token ids ride along as vLLM's extension fields, and the
    policy version that answered (when stamped) as ``policy_version``."""
    choice: dict[str, Any] = {
        "index": 0,
        "message": assistant_message(completion),
        "finish_reason": completion.finish_reason,
        "logprobs": _logprobs(request, completion),
    }
    if completion.completion_token_ids is not None:
        choice["token_ids"] = completion.completion_token_ids
    body: dict[str, Any] = {
        "id": f"chatcmpl-{call_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": completion.model or request.model or "policy",
        "choices": [choice],
        "usage": _usage(completion),
    }
    if completion.prompt_token_ids is not None:
        body["prompt_token_ids"] = completion.prompt_token_ids
    if completion.policy_version is not None:  # our extension: the trainer's generator served to Ray workers
        body["policy_version"] = completion.policy_version
    return body


def completion_sse(request: ChatRequest, completion: Completion, call_id: str) -> list[bytes]:
    """The same answer as ``chat.completion.chunk`` server-sent events, ending with ``[DONE]``."""
    base = {
        "id": f"chatcmpl-{call_id}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": completion.model or request.model or "policy",
    }
    chunks: list[dict[str, Any]] = [
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
    ]
    if completion.text:
        chunks.append({**base, "choices": [{"index": 0, "delta": {"content": completion.text}, "finish_reason": None}]})
    for i, tc in enumerate(completion.tool_calls):
        delta = {"tool_calls": [{"index": i, **tc.to_openai()}]}
        chunks.append({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
    last: dict[str, Any] = {"index": 0, "delta": {}, "finish_reason": completion.finish_reason}
    if completion.completion_token_ids is not None:
        last["token_ids"] = completion.completion_token_ids
    chunks.append({**base, "choices": [last]})
    if (request.extra.get("stream_options") or {}).get("include_usage"):
        chunks.append({**base, "choices": [], "usage": _usage(completion)})
    return [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]
