"""A teacher's call in the student's tokens: the one place agentgym-lightning tokenizes text again.

Everywhere else training reads the token ids the generator recorded, never re-tokenized (the
prompt the model saw and the tokens it sampled, exactly). A teacher behind an OpenAI-compatible
API (distillation) answers in text, or in the ids of its *own* vocabulary, so its calls cannot be
trained on as recorded: they are rendered once with the student's chat template, as the student's
own policy would have seen and written them —

* the prompt: :func:`~agentgym_lightning.policies.chat.render_prompt_ids` of the recorded request
  (the messages and tools the agent sent), exactly what the student's generator is fed;
* the completion: the teacher's text and tool calls as the student writes them
  (:func:`~agentgym_lightning.policies.tool_calls.render_assistant_text`: ``<tool_call>`` blocks
  for a template without tool support), tokenized without special tokens, then the end-of-turn
  token the student's generation stops at (unless the teacher was cut by its token limit).

So ``decode(completion_ids)`` (special tokens skipped) is the teacher's text, and the student's
generator parses it back into the same content and tool calls. Each row made this way says so in
its ``metadata`` (``retokenized``, the tokenizer, the teacher's model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentgym_lightning.policies.chat import render_prompt_ids
from agentgym_lightning.policies.tool_calls import render_assistant_text
from agentgym_lightning.trajectory import Step

__all__ = ["RetokenizedCall", "retokenize_call", "teacher_text"]


@dataclass
class RetokenizedCall:
    """A call's prompt and completion in the student's tokens, and where they came from."""

    prompt_ids: list[int]
    completion_ids: list[int]
    metadata: dict[str, Any]


def teacher_text(step: Step) -> str:
    """The teacher's completion as the student writes it: its text, then its tool calls."""
    c = step.completion
    if c is None:
        raise ValueError(f"call {step.index} has no completion to re-tokenize")
    return render_assistant_text(c.text, c.tool_calls)


def retokenize_call(tokenizer: Any, step: Step, tool_prompt: str = "full") -> RetokenizedCall:
    """``step``'s prompt and completion tokenized with ``tokenizer``'s chat template (see the
    module docstring); ``tool_prompt`` as the student's policy describes tools."""
    c = step.completion
    if c is None:
        raise ValueError(f"call {step.index} has no completion to re-tokenize")
    text = teacher_text(step)
    completion = [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]
    if c.finish_reason != "length" and tokenizer.eos_token_id is not None:
        completion.append(int(tokenizer.eos_token_id))  # the student learns to end its turn there
    return RetokenizedCall(
        prompt_ids=render_prompt_ids(tokenizer, step.request, tool_prompt),
        completion_ids=completion,
        metadata={
            "retokenized": True,
            "tokenizer": str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__),
            "teacher_model": c.model,
            "why": "the teacher's text in the student's chat template (its own ids, if any, are another vocabulary's)",
        },
    )
