"""The two halves of one LLM call: the request an agent sent, and the completion that answers it.

These are the observation and the action of :class:`~agentgym_lightning.env.AgentEnv`, and the
currency every policy backend speaks. Token ids and logprobs ride on :class:`Completion` so that a
trainer never has to re-tokenize what the model produced.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["SamplingParams", "ChatRequest", "ToolCall", "Completion", "as_completion"]


@dataclass
class SamplingParams:
    """Sampling options the agent asked for (OpenAI names; ``None`` means "not given")."""

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: list[str] | None = None
    seed: int | None = None
    n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> SamplingParams:
        return cls(**(data or {}))


_SAMPLING_KEYS = {f.name for f in fields(SamplingParams)}
# Request keys that are not sampling options but that we keep as typed fields.
_REQUEST_KEYS = {"messages", "tools", "tool_choice", "model", "stream", "metadata", "max_completion_tokens"}


def _check_sampling(sampling: dict[str, Any]) -> None:
    """Reject values no backend can honour, so the agent that sent them gets the error (a 400),
    not the whole batch it would have been generated with."""

    def number(name: str, low: float, high: float, low_open: bool = False) -> None:
        value = sampling.get(name)
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"'{name}' must be a number, got {value!r}")
        if value < low or value > high or (low_open and value == low):
            bracket = "(" if low_open else "["
            raise ValueError(f"'{name}' must be in {bracket}{low}, {high}], got {value}")

    number("temperature", 0.0, 2.0)
    number("top_p", 0.0, 1.0, low_open=True)
    number("presence_penalty", -2.0, 2.0)
    number("frequency_penalty", -2.0, 2.0)
    for name in ("max_tokens", "n", "top_logprobs", "seed"):
        value = sampling.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"'{name}' must be an integer, got {value!r}")
    if sampling.get("max_tokens") is not None and sampling["max_tokens"] < 1:
        raise ValueError(f"'max_tokens' must be >= 1, got {sampling['max_tokens']}")
    stop = sampling.get("stop")
    if stop is not None and not (isinstance(stop, list) and all(isinstance(x, str) for x in stop)):
        raise ValueError("'stop' must be a string or a list of strings")


@dataclass
class ChatRequest:
    """An intercepted ``/v1/chat/completions`` request.

    ``messages`` and ``tools`` are kept in the OpenAI wire format (plain dicts) so any chat
    template can render them. Parameters we do not model are kept verbatim in ``extra``.
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    model: str = ""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stream: bool = False
    #: The request's OpenAI ``metadata``; ``{"trainable": "false"}`` marks a call not to train on,
    #: ``{"role": "checker"}`` names the part of the agent that made it, ``{"agent": "writer"}``
    #: the framework agent (LangGraph node, Agents SDK agent) that made it.
    metadata: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_openai(cls, body: dict[str, Any]) -> ChatRequest:
        """Build from an OpenAI request body; raises :class:`ValueError` with a clear message."""
        if not isinstance(body, dict):
            raise ValueError("request body must be a JSON object")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ValueError("'messages' must be a non-empty list of chat messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise ValueError(f"messages[{i}] must be an object with a string 'role'")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise ValueError("'tools' must be a list of tool definitions")
        sampling = {k: body[k] for k in _SAMPLING_KEYS if body.get(k) is not None}
        if body.get("max_completion_tokens") is not None and "max_tokens" not in sampling:
            sampling["max_tokens"] = body["max_completion_tokens"]
        if isinstance(sampling.get("stop"), str):
            sampling["stop"] = [sampling["stop"]]
        _check_sampling(sampling)
        metadata = body.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise ValueError("'metadata' must be an object of strings")
        extra = {k: v for k, v in body.items() if k not in _SAMPLING_KEYS and k not in _REQUEST_KEYS}
        return cls(
            messages=messages,
            tools=tools,
            tool_choice=body.get("tool_choice"),
            model=str(body.get("model") or ""),
            sampling=SamplingParams(**sampling),
            stream=bool(body.get("stream", False)),
            metadata={str(k): str(v) for k, v in metadata.items()},
            extra=extra,
        )

    def to_openai(self) -> dict[str, Any]:
        """The request body again, as an OpenAI client would send it."""
        body: dict[str, Any] = {"model": self.model, "messages": self.messages, **self.sampling.to_dict()}
        if self.tools is not None:
            body["tools"] = self.tools
        if self.tool_choice is not None:
            body["tool_choice"] = self.tool_choice
        if self.stream:
            body["stream"] = True
        if self.metadata:
            body["metadata"] = self.metadata
        body.update(self.extra)
        return body

    @property
    def trainable(self) -> bool:
        """False when the agent marked this call ``metadata={"trainable": "false"}``."""
        return self.metadata.get("trainable", "true").lower() not in ("false", "0", "no")

    def to_dict(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "tools": self.tools,
            "tool_choice": self.tool_choice,
            "model": self.model,
            "sampling": self.sampling.to_dict(),
            "stream": self.stream,
            "metadata": self.metadata,
            "extra": self.extra,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChatRequest:
        data = dict(data)
        data["sampling"] = SamplingParams.from_dict(data.get("sampling"))
        return cls(**data)


@dataclass
class ToolCall:
    """One function call the model made, OpenAI style (``arguments`` is the raw JSON text)."""

    id: str
    name: str
    arguments: str = "{}"

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    @classmethod
    def from_openai(cls, data: dict[str, Any]) -> ToolCall:
        fn = data.get("function") or {}
        args = fn.get("arguments", "{}")
        if not isinstance(args, str):
            args = json.dumps(args)
        return cls(id=str(data.get("id") or ""), name=str(fn.get("name") or ""), arguments=args)


@dataclass
class Completion:
    """The answer to one LLM call: the env's action.

    Token ids are exactly those the model saw (``prompt_token_ids``) and produced
    (``completion_token_ids``); ``logprobs[i]`` is the sampling logprob of
    ``completion_token_ids[i]``. They are ``None`` when the backend cannot provide them (an
    external API), never guessed.
    """

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    model: str | None = None
    #: Why text that looked like tool calls was not parsed as one (malformed JSON, no name...):
    #: the call stays in ``text`` for the agent to see, and this is an AIR signal.
    tool_call_errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.completion_token_ids is not None and self.logprobs is not None:
            if len(self.logprobs) != len(self.completion_token_ids):
                raise ValueError(
                    f"logprobs has {len(self.logprobs)} entries but completion_token_ids has "
                    f"{len(self.completion_token_ids)}; they must align one per token"
                )

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "tool_calls": [tc.to_openai() for tc in self.tool_calls],
            "finish_reason": self.finish_reason,
            "prompt_token_ids": self.prompt_token_ids,
            "completion_token_ids": self.completion_token_ids,
            "logprobs": self.logprobs,
            "model": self.model,
            "tool_call_errors": self.tool_call_errors,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Completion:
        data = dict(data)
        data["tool_calls"] = [ToolCall.from_openai(tc) for tc in data.get("tool_calls") or []]
        return cls(**data)


def as_completion(action: Any) -> Completion:
    """Accept what a policy naturally returns: a :class:`Completion`, a string, or a dict.

    A dict may be a :meth:`Completion.to_dict` or an OpenAI chat-completion message
    (``{"content": ..., "tool_calls": [...]}``).
    """
    if isinstance(action, Completion):
        return action
    if isinstance(action, str):
        return Completion(text=action)
    if isinstance(action, dict):
        if "content" in action and "text" not in action:
            tool_calls = [ToolCall.from_openai(tc) for tc in action.get("tool_calls") or []]
            return Completion(
                text=action.get("content") or "",
                tool_calls=tool_calls,
                finish_reason="tool_calls" if tool_calls else "stop",
            )
        return Completion.from_dict(action)
    raise TypeError(
        f"an action must be a Completion, a str or a dict, not {type(action).__name__}; "
        "wrap your policy's output with agentgym_lightning.Completion(text=...)"
    )
