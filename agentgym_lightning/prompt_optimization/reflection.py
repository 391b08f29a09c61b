"""The reflection model: the LLM that reads how a prompt did and writes a better one.

GEPA asks its reflection model one question at a time, ``lm(prompt) -> text`` (its
``LanguageModel`` protocol). :class:`ReflectionModel` answers it with any of our policies: the
``openai`` backend for an OpenAI-compatible server (``--reflection-base-url``: ``vllm serve``, a
hosted API), or the agent's own policy (``--reflection-base-url policy``: the model being optimized
reflects on itself, loaded once). Each question is one chat request with the model's sampling
options; a failure is counted, so the optimizer can stop on a reflection model that keeps failing
instead of spending its budget on parents it cannot improve (GEPA itself logs a failed reflection
and goes on).
"""

from __future__ import annotations

from typing import Any

from agentgym_lightning.llm import ChatRequest, SamplingParams

__all__ = ["ReflectionModel", "ReflectionFailed"]


class ReflectionFailed(RuntimeError):
    """The reflection model failed (unreachable, refused, or answered nothing)."""


class ReflectionModel:
    """``lm(prompt) -> text`` over a policy (GEPA's ``LanguageModel``).

    Args:
        policy: Anything with ``generate(requests) -> completions`` (a
            :class:`~agentgym_lightning.policies.base.Policy`), or such a function itself.
        temperature: Sampling temperature of each question (a proposal from a greedy model
            repeats itself on the same evidence).
        max_tokens: Most tokens an answer may have.
        model: The request's ``model`` (an OpenAI-compatible server's model name; ``""``: the
            policy's own).
    """

    def __init__(self, policy: Any, *, temperature: float = 0.7, max_tokens: int = 512, model: str = "") -> None:
        if temperature < 0:
            raise ValueError(f"the reflection temperature must be >= 0, got {temperature}")
        if max_tokens < 1:
            raise ValueError(f"the reflection max_tokens must be >= 1, got {max_tokens}")
        self.policy = policy
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.model = model
        #: Questions asked, and how many failed in a row (reset by an answer).
        self.calls = 0
        self.failures_in_a_row = 0
        self.last_error: str | None = None

    def __call__(self, prompt: str | list[dict[str, Any]]) -> str:
        """Ask ``prompt`` (a text, or chat messages) and return the answer's text; raises
        :class:`ReflectionFailed` saying why when there is none."""
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        request = ChatRequest(
            messages=messages,
            model=self.model,
            sampling=SamplingParams(temperature=self.temperature, max_tokens=self.max_tokens),
            metadata={"role": "reflection", "trainable": "false"},
        )
        self.calls += 1
        try:
            completion = getattr(self.policy, "generate", self.policy)([request])[0]
        except Exception as exc:  # noqa: BLE001 - any backend failure is the reflection's failure
            self._failed(f"{type(exc).__name__}: {exc}")
            raise ReflectionFailed(f"the reflection model failed: {self.last_error}") from exc
        text = completion.text or ""
        if not text.strip():
            self._failed("it answered with no text")
            raise ReflectionFailed("the reflection model answered with no text")
        self.failures_in_a_row = 0
        return text

    def _failed(self, why: str) -> None:
        self.failures_in_a_row += 1
        self.last_error = why[:2000]
