"""The two halves of one LLM call: the request an agent sent, and the completion that answers it
(or the OpenAI-shaped error, :class:`GatewayError`, that refuses it).

These are the observation and the action of :class:`~agentgym_lightning.env.AgentEnv`, and the
currency every policy backend speaks. Token ids and logprobs ride on :class:`Completion` so that a
trainer never has to re-tokenize what the model produced.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = [
    "SamplingParams",
    "ChatRequest",
    "ToolCall",
    "Completion",
    "GatewayError",
    "as_completion",
    "EPISODE_KEY",
    "ADAPTER_KEY",
    "BASE_ADAPTER",
    "new_tool_call_id",
    "new_call_id",
    "common_prefix_length",
    "ids_extend",
]

#: The ``metadata`` key under which the rollout driver names a request's episode when it hands
#: the request to a policy (a policy with several replicas keeps an episode on one of them).
EPISODE_KEY = "agentgym_episode"
#: The ``metadata`` key naming the LoRA adapter a request is generated with (``lora_per_agent``:
#: each trained agent has its own; absent, the policy's own weights). The trainer's adapter routing
#: sets it; ``hf`` and ``vllm`` generate each request with its adapter, ``openai`` sends it as the
#: request's ``model`` (how an OpenAI-compatible server such as ``vllm serve --enable-lora`` selects one).
ADAPTER_KEY = "agentgym_adapter"
#: The adapter name meaning "no adapter: the base model alone" (PEFT's own name for it).
BASE_ADAPTER = "__base__"


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


#: Seeds torch and vLLM accept (OpenAI documents a 64-bit integer).
SEED_RANGE = (-(2**63), 2**63 - 1)
#: The most ``max_tokens`` a request may ask for (backends cap it to the context anyway).
MAX_TOKENS_LIMIT = 2**31 - 1


def _check_sampling(sampling: dict[str, Any]) -> None:
    """Reject values no backend can honour, so the agent that sent them gets the error (a 400),
    not the whole batch it would have been generated with."""

    def number(name: str, low: float, high: float, low_open: bool = False) -> None:
        value = sampling.get(name)
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"'{name}' must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"'{name}' must be a finite number, got {value}")
        if value < low or value > high or (low_open and value == low):
            bracket = "(" if low_open else "["
            raise ValueError(f"'{name}' must be in {bracket}{low}, {high}], got {value}")

    def integer(name: str, low: int, high: int) -> None:
        value = sampling.get(name)
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"'{name}' must be an integer, got {value!r}")
        if not low <= value <= high:
            raise ValueError(f"'{name}' must be >= {low} and <= {high}, got {value}")

    number("temperature", 0.0, 2.0)
    number("top_p", 0.0, 1.0, low_open=True)
    number("presence_penalty", -2.0, 2.0)
    number("frequency_penalty", -2.0, 2.0)
    integer("max_tokens", 1, MAX_TOKENS_LIMIT)
    integer("n", 1, MAX_TOKENS_LIMIT)
    integer("top_logprobs", 0, 20)
    integer("seed", *SEED_RANGE)
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
    #: The wire the call came on (``"chat"``, ``"responses"``, ``"completions"``, ``"messages"``:
    #: :mod:`agentgym_lightning.gateway.wires`); every wire is translated into these same fields,
    #: so a policy sees one conversation whichever API the agent used.
    wire: str = "chat"
    #: A legacy ``/completions`` call's raw prompt: the policy generates from this text as it is,
    #: with no chat template (``messages`` then holds it as one user message, for backends and
    #: readers that know only conversations). ``None`` for every chat-shaped call.
    prompt: str | None = None

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

    @property
    def repeated_user_turn(self) -> bool:
        """True when the conversation's last user message comes twice in a row (the same message
        right before it), as Semantic Kernel's ``OpenAIResponsesAgent`` sends every user turn: the
        policy saw the turn twice, and a step trained on is trained with it twice. The gateway
        warns once per process; the trainer counts these steps (``samples/calls/repeated_user_turn``);
        ``docs/frameworks.md`` says what to do."""
        for i in range(len(self.messages) - 1, 0, -1):
            if self.messages[i].get("role") == "user":
                return self.messages[i - 1] == self.messages[i]
        return False

    def to_dict(self) -> dict[str, Any]:
        data = {
            "messages": self.messages,
            "tools": self.tools,
            "tool_choice": self.tool_choice,
            "model": self.model,
            "sampling": self.sampling.to_dict(),
            "stream": self.stream,
            "metadata": self.metadata,
            "extra": self.extra,
        }
        # Written only when not a plain chat call: chat trajectories stay as they were.
        if self.wire != "chat":
            data["wire"] = self.wire
        if self.prompt is not None:
            data["prompt"] = self.prompt
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChatRequest:
        data = dict(data)
        data["sampling"] = SamplingParams.from_dict(data.get("sampling"))
        return cls(**data)


@dataclass
class ToolCall:
    """One function call the model made, OpenAI style (``arguments`` is the raw JSON text).

    ``arguments`` may be given as a mapping; it is stored as its JSON text.
    """

    id: str
    name: str
    arguments: str = "{}"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a tool call needs a non-empty string 'name', got {self.name!r:.80}")
        if not isinstance(self.id, str):
            raise ValueError(f"a tool call's 'id' must be a string, got {self.id!r:.80}")
        if isinstance(self.arguments, Mapping):
            self.arguments = json.dumps(dict(self.arguments), ensure_ascii=False)
        elif not isinstance(self.arguments, str):
            raise ValueError(
                f"tool call {self.name!r}: 'arguments' must be a JSON string or an object, "
                f"got {type(self.arguments).__name__}"
            )

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    @classmethod
    def from_dict(cls, data: Any) -> ToolCall:
        """Read a tool call in either shape people write:

        - OpenAI's nested one, ``{"id", "type": "function", "function": {"name", "arguments"}}``;
        - the flat one, ``{"id", "name", "arguments"}``.

        ``arguments`` may be a JSON string or an object (missing means ``{}``); a missing ``id``
        gets a fresh one. Anything else raises :class:`ValueError` saying what is wrong.
        """
        if isinstance(data, ToolCall):
            return data
        if not isinstance(data, Mapping):
            raise ValueError(f"a tool call must be an object, got {type(data).__name__}: {data!r:.80}")
        if "function" in data:
            fn = data["function"]
            if not isinstance(fn, Mapping):
                raise ValueError(f"a tool call's 'function' must be an object with 'name' and 'arguments', got {fn!r:.80}")
            if data.get("type", "function") != "function":
                raise ValueError(f"only 'function' tool calls are supported, got type {data.get('type')!r:.40}")
            extra = set(data) - {"id", "type", "function", "index"}
        elif "name" in data:
            fn = data
            extra = set(data) - {"id", "type", "name", "arguments"}
        else:
            raise ValueError(
                "a tool call must be {'id', 'type': 'function', 'function': {'name', 'arguments'}} (OpenAI) "
                f"or {{'id', 'name', 'arguments'}}; got keys {sorted(map(str, data))}"
            )
        if extra:
            raise ValueError(f"unexpected keys in a tool call: {sorted(map(str, extra))}")
        call_id = data.get("id")
        arguments = fn.get("arguments")
        return cls(
            id=new_tool_call_id() if call_id is None else call_id,
            name=fn.get("name"),  # type: ignore[arg-type] - checked in __post_init__
            arguments="{}" if arguments is None else arguments,
        )

    #: The OpenAI wire shape is one of the shapes :meth:`from_dict` reads.
    from_openai = from_dict


def new_tool_call_id() -> str:
    """A fresh OpenAI-style call id, ``call_<24 hex digits>``."""
    return "call_" + uuid.uuid4().hex[:24]


def common_prefix_length(*sequences: Sequence[Any]) -> int:
    """How many leading items all ``sequences`` share (token ids, messages); the one count of the
    trajectory file's steps, the hf backend's prefix cache and the token tree's micro-batch cuts."""
    length = 0
    for column in zip(*sequences):
        if any(item != column[0] for item in column[1:]):
            break
        length += 1
    return length


def ids_extend(ids: Sequence[int], *prefix: Sequence[int]) -> bool:
    """Whether token ids ``ids`` begin with the ``prefix`` sequences, one after another: a call's
    prompt extending the previous call's prompt + completion (the one check of the env and the
    trainer's row merging; no concatenation is built)."""
    start = 0
    for part in prefix:
        end = start + len(part)
        if len(ids) < end:
            return False
        head = ids[start:end]
        if head != part and list(head) != list(part):  # a list never equals a tuple: compare as lists
            return False
        start = end
    return True


def new_call_id() -> str:
    """A fresh id for one intercepted LLM call (its completion's ``chatcmpl-<id>``)."""
    return uuid.uuid4().hex[:24]


class GatewayError(Exception):
    """A request the gateway refuses; rendered as an OpenAI error body with ``status``."""

    def __init__(self, status: int, message: str, code: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


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
    #: ``"stop"``, ``"length"``, ``"tool_calls"``...; when not given, ``"tool_calls"`` if there are
    #: tool calls and ``"stop"`` otherwise, so an agent sees what OpenAI would have sent.
    finish_reason: str = None  # type: ignore[assignment] - always a str after __post_init__
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    model: str | None = None
    #: Why text that looked like tool calls was not parsed as one (malformed JSON, no name...):
    #: the call stays in ``text`` for the agent to see, and this is an AIR signal.
    tool_call_errors: list[str] = field(default_factory=list)
    #: The policy version that answered (the number of updates its weights had seen), stamped by
    #: the trainer's generator; the episode records it as ``Step.policy_version`` (which is what
    #: files carry: not part of :meth:`to_dict`). ``None``: not stamped (outside training).
    policy_version: int | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.tool_calls, list):
            raise ValueError(f"tool_calls must be a list of tool calls, got {type(self.tool_calls).__name__}")
        self.tool_calls = [ToolCall.from_dict(tc) for tc in self.tool_calls]
        if self.finish_reason is None:
            self.finish_reason = "tool_calls" if self.tool_calls else "stop"
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
        """The inverse of :meth:`to_dict`; ``tool_calls`` may be in either shape
        :meth:`ToolCall.from_dict` reads."""
        data = dict(data)
        data["tool_calls"] = list(data.get("tool_calls") or [])
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
            return Completion(text=action.get("content") or "", tool_calls=list(action.get("tool_calls") or []))
        try:
            return Completion.from_dict(action)
        except TypeError as exc:  # keys a Completion does not have
            hint = (
                ": that is one tool call; answer with {'content': None, 'tool_calls': [it]}"
                if {"name", "arguments"} <= action.keys() or "function" in action
                else ""
            )
            raise ValueError(
                f"a dict action must be a Completion's fields (text, tool_calls, ...) or an OpenAI message "
                f"(content, tool_calls), got keys {sorted(map(str, action))} ({exc}){hint}"
            ) from None
    raise TypeError(
        f"an action must be a Completion, a str or a dict, not {type(action).__name__}; "
        "wrap your policy's output with agentgym_lightning.Completion(text=...)"
    )
