"""Chat requests to token ids and token ids back to completions, with a tokenizer's chat template.

Shared by every backend that tokenizes itself (``hf``, ``vllm``): the same rendering everywhere
means the same prompt ids for the same conversation, whichever engine generates.

* :func:`render_prompt_ids` / :func:`render_prompt_text` — an OpenAI :class:`ChatRequest` through
  the tokenizer's chat template (a legacy completion's raw ``prompt``: as it is). Templates with native tool support get ``tools`` and the
  assistant ``tool_calls`` in Hugging Face's structure; templates without it (SmolLM2's) get the
  tools described in the system prompt, tool calls written back as ``<tool_call>`` text and tool
  results as ``<tool_response>`` user messages (see :mod:`.tool_calls`).
* :func:`decode_completion` — decoded text, parsed tool calls and the exact ids/logprobs.
* :func:`stop_token_ids` — the ids of tokens named by their text (``"<|im_start|>"``) that end a
  completion as EOS does (a backend's ``stop_tokens`` option); :func:`request_stop_token_ids` —
  the ids a request names itself (vLLM's ``stop_token_ids``).

These names are stable API.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentgym_lightning.llm import ChatRequest, Completion
from agentgym_lightning.policies.tool_calls import (
    ParsedToolCalls,
    parse_tool_calls,
    render_assistant_text,
    render_tool_result,
    render_tools_system_prompt,
)

__all__ = [
    "template_supports_tools",
    "content_text",
    "prepare_messages",
    "render_prompt_text",
    "render_prompt_ids",
    "DecodedCompletion",
    "decode_completion",
    "completion_of",
    "stop_token_ids",
    "request_stop_token_ids",
]


def _template_source(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: {"default": ..., "tool_use": ...}
        template = template.get("tool_use") or template.get("default") or ""
    if not template:
        raise ValueError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template; "
            "use an instruct/chat model (or set tokenizer.chat_template)"
        )
    return str(template)


def template_supports_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders ``tools`` and assistant ``tool_calls`` itself.

    A heuristic on the template source (as Hugging Face's own docs suggest): it must mention both.
    SmolLM2-135M-Instruct's template does not, so it gets the text fallback.
    """
    source = _template_source(tokenizer)
    return "tools" in source and "tool_calls" in source


def content_text(content: Any) -> str:
    """An OpenAI message ``content`` as plain text (``None`` → ``""``, text parts joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type", "text") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                parts.append(part)
            else:
                raise ValueError(f"only text content parts are supported, got {part!r:.80}")
        return "".join(parts)
    return str(content)


def _hf_tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI ``tool_calls`` entry → Hugging Face template structure (arguments as an object)."""
    import json

    fn = call.get("function") or {}
    args: Any = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (json.JSONDecodeError, RecursionError):
            pass  # leave the raw string; the template will print it
    out: dict[str, Any] = {"type": "function", "function": {"name": fn.get("name", ""), "arguments": args}}
    if call.get("id"):
        out["id"] = call["id"]
    return out


def prepare_messages(
    request: ChatRequest, native_tools: bool, tool_prompt: str = "full"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The ``(messages, tools)`` to hand to ``apply_chat_template`` for ``request``.

    With ``native_tools`` the template gets OpenAI tools and tool calls in Hugging Face's shape.
    Without, everything becomes plain text: the tools go into the (possibly new) system message,
    described in the ``tool_prompt`` style (:data:`~.tool_calls.TOOL_PROMPTS`), assistant tool
    calls become ``<tool_call>`` text, and each run of ``tool`` messages becomes one ``user``
    message of ``<tool_response>`` blocks. ``developer`` is treated as ``system``.
    """
    messages: list[dict[str, Any]] = []
    tools = list(request.tools) if request.tools else None
    if native_tools:
        for m in request.messages:
            msg = dict(m)
            if msg["role"] == "developer":
                msg["role"] = "system"
            msg["content"] = content_text(msg.get("content"))
            if msg.get("tool_calls"):
                msg["tool_calls"] = [_hf_tool_call(c) for c in msg["tool_calls"]]
            messages.append(msg)
        return messages, tools

    for m in request.messages:
        role = "system" if m["role"] == "developer" else m["role"]
        text = content_text(m.get("content"))
        if role == "assistant" and m.get("tool_calls"):
            text = render_assistant_text(text, m["tool_calls"])
        if role == "tool":
            block = render_tool_result(text, m.get("name"))
            if messages and messages[-1].get("_tool_results"):
                messages[-1]["content"] += "\n" + block  # consecutive results share one turn
            else:
                messages.append({"role": "user", "content": block, "_tool_results": True})
            continue
        messages.append({"role": role, "content": text})
    for msg in messages:
        msg.pop("_tool_results", None)
    if tools:
        if messages and messages[0]["role"] == "system":
            messages[0]["content"] = render_tools_system_prompt(tools, messages[0]["content"], tool_prompt)
        else:
            messages.insert(0, {"role": "system", "content": render_tools_system_prompt(tools, style=tool_prompt)})
    return messages, None


def render_prompt_text(tokenizer: Any, request: ChatRequest, tool_prompt: str = "full") -> str:
    """The prompt as text, ending with the assistant generation prompt (a legacy completion's
    raw ``prompt`` as it is)."""
    if request.prompt is not None:
        return request.prompt
    messages, tools = prepare_messages(request, template_supports_tools(tokenizer), tool_prompt)
    kwargs: dict[str, Any] = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)


def render_prompt_ids(tokenizer: Any, request: ChatRequest, tool_prompt: str = "full") -> list[int]:
    """The prompt token ids the model is fed for ``request`` (chat template, generation prompt on).

    Tokenized by the template call itself (``tokenize=True``), so special tokens are the
    template's and no BOS is added twice. ``tool_prompt``: how a template without tool support
    gets the tools described (:func:`prepare_messages`). A legacy completion's raw ``prompt``
    (``request.prompt``) is tokenized as it is, with no template (special tokens added as the
    tokenizer adds them to any text, as vLLM does for a raw prompt).
    """
    if request.prompt is not None:
        return [int(i) for i in tokenizer(request.prompt)["input_ids"]]
    messages, tools = prepare_messages(request, template_supports_tools(tokenizer), tool_prompt)
    kwargs: dict[str, Any] = {"tools": tools} if tools else {}
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
    )
    if isinstance(ids, Mapping):  # some versions ignore return_dict=False
        ids = ids["input_ids"]
    if ids and isinstance(ids[0], list):  # a batch of one
        ids = ids[0]
    return [int(i) for i in ids]


@dataclass
class DecodedCompletion:
    """A :class:`Completion` and the tool-call parse behind it (``parsed.errors``: malformed calls)."""

    completion: Completion
    parsed: ParsedToolCalls


def decode_completion(
    tokenizer: Any,
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    logprobs: Sequence[float] | None,
    finish_reason: str,
    *,
    text: str | None = None,
    parse_tools: bool = True,
    model: str | None = None,
) -> DecodedCompletion:
    """Build the :class:`Completion` for generated tokens, with the tool-call parse behind it (for AIR).

    ``completion_ids`` are exactly what the model produced (up to and including EOS or the token
    that completed a stop string); ``logprobs`` align with them one per token. ``text`` defaults
    to their decoding without special tokens; pass it when a stop string was cut out of it.
    With ``parse_tools`` (pass ``bool(request.tools)``), ``<tool_call>`` blocks become
    ``tool_calls``, the text becomes what lies outside them and ``finish_reason`` becomes
    ``"tool_calls"``; otherwise ``finish_reason`` is kept (``"stop"``/``"length"``).
    """
    if text is None:
        text = tokenizer.decode(list(completion_ids), skip_special_tokens=True)
    parsed = parse_tool_calls(text) if parse_tools else ParsedToolCalls(content=text)
    if parsed.tool_calls:
        out_text, reason = parsed.content, "tool_calls"
    else:
        # No valid call: keep the text byte-exact (not stripped), so that the agent echoing it
        # back re-renders to the same tokens.
        out_text, reason = text, finish_reason
    completion = Completion(
        text=out_text,
        tool_calls=list(parsed.tool_calls),
        finish_reason=reason,
        prompt_token_ids=[int(i) for i in prompt_ids],
        completion_token_ids=[int(i) for i in completion_ids],
        logprobs=None if logprobs is None else [float(x) for x in logprobs],
        model=model,
        tool_call_errors=list(parsed.errors),
    )
    return DecodedCompletion(completion=completion, parsed=parsed)


def completion_of(
    tokenizer: Any,
    model: str | None,
    request: ChatRequest,
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    logprobs: Sequence[float] | None,
    finish_reason: str,
    text: str | None = None,
) -> Completion:
    """The :class:`Completion` a local backend (``hf``, ``vllm``) answers ``request`` with: the
    tokens it generated after ``prompt_ids``, tool calls parsed when the request offers tools
    (:func:`decode_completion`; ``text``: the answer cut before a stop string)."""
    return decode_completion(
        tokenizer, prompt_ids, completion_ids, logprobs, finish_reason, text=text, parse_tools=bool(request.tools), model=model
    ).completion


def stop_token_ids(tokenizer: Any, stop_tokens: Sequence[str]) -> frozenset[int]:
    """The ids of ``stop_tokens``, each one token of ``tokenizer``'s vocabulary named by its text
    (``"<|im_start|>"``), for a backend's ``stop_tokens`` option: a completion ends with any of
    them as it ends with EOS (``finish_reason`` ``"stop"``, the token kept in the ids).

    Why by token and not a stop string: the tokens that open a new chat turn are special tokens,
    which decoded text leaves out, so no stop string can see them. A sampled ``<|im_start|>`` after
    an answer is the model starting a made-up next turn; unstopped, RL rewards that made-up turn
    with the answer before it (docs/experiments.md, Spider).

    Raises:
        ValueError: a name that is not exactly one token of the vocabulary.
    """
    if isinstance(stop_tokens, str):
        raise ValueError(f"stop_tokens must be a list of token texts, got the string {stop_tokens!r}")
    vocab = tokenizer.get_vocab()
    ids = set()
    for name in stop_tokens:
        if name not in vocab:
            pieces = tokenizer.encode(str(name), add_special_tokens=False)
            raise ValueError(
                f"stop token {name!r} is not one token of the model's vocabulary (it encodes to {len(pieces)} tokens "
                f"{pieces}); name a single token such as {tokenizer.eos_token!r}, or use a stop string (the request's `stop`)"
            )
        ids.add(int(vocab[name]))
    return frozenset(ids)


def request_stop_token_ids(request: ChatRequest, vocab_size: int | None = None) -> frozenset[int]:
    """The token ids a request itself asks to stop at: vLLM's ``stop_token_ids`` extension of the
    chat API (the ``vllm-server`` backend sends its ``stop_tokens`` so), honoured by the local
    backends too so that a policy served by :class:`~agentgym_lightning.policies.policy_server.PolicyServer`
    stops where a vLLM server would.

    Raises:
        ValueError: not a list of token ids (of the vocabulary, when ``vocab_size`` is given).
    """
    given = request.extra.get("stop_token_ids")
    if given is None:
        return frozenset()
    if not isinstance(given, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in given):
        raise ValueError(f"'stop_token_ids' must be a list of non-negative token ids; got {given!r}")
    if vocab_size is not None and any(i >= vocab_size for i in given):
        raise ValueError(f"'stop_token_ids' {given!r} names ids outside the model's vocabulary (0 to {vocab_size - 1})")
    return frozenset(given)
