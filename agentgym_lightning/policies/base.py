"""The policy interface: what answers an environment's pending LLM calls."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from agentgym_lightning.llm import ChatRequest, Completion

__all__ = ["Policy"]


class Policy(ABC):
    """Answers a batch of intercepted chat requests with completions, token-exact.

    ``generate`` must return one :class:`Completion` per request, in order, with
    ``prompt_token_ids``/``completion_token_ids``/``logprobs`` exactly as the model saw and
    produced them (``None`` only where the backend cannot know them). A model output that is
    not a valid tool call is a normal completion, never an exception.
    """

    #: Short backend name (``hf``, ``vllm``, ``openai``).
    backend: str = ""
    #: The model this policy serves (path or id), for logs.
    model: str = ""

    @abstractmethod
    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        """One completion per request, in order."""

    def close(self) -> None:
        """Release the model/engine/connections. Idempotent."""

    def __enter__(self) -> Policy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
