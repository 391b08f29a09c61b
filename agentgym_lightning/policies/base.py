"""The policy interface: what answers an environment's pending LLM calls; and what the trainer
needs of a policy whose weights it trains (:class:`TrainablePolicy` and its two kinds)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from agentgym_lightning.llm import ChatRequest, Completion

__all__ = ["Policy", "TrainablePolicy", "ModelSharingPolicy", "WeightLoadingPolicy", "AdapterLoadingPolicy"]


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


@runtime_checkable
class TrainablePolicy(Protocol):
    """A generator the trainer can train: it names its weights and tokenizes as the trained
    model does. Either it generates with the trained model itself (:class:`ModelSharingPolicy`,
    ``hf``) or it receives the trained weights after each update (:class:`WeightLoadingPolicy`,
    ``vllm``); an API backend (``openai``) is neither."""

    #: The local folder of the weights it generates with (the trainer loads its copy from here).
    path: str
    #: The ``transformers`` tokenizer of those weights.
    tokenizer: Any


@runtime_checkable
class ModelSharingPolicy(TrainablePolicy, Protocol):
    """Generates with an in-process ``transformers`` model that the trainer trains in place (no
    copy, no weight sync); the trainer may swap in a wrapped model (a LoRA adapter)."""

    #: The ``transformers`` causal LM it generates with.
    hf_model: Any
    #: The id padding its batches (the trainer pads its own batches with the same).
    pad_token_id: int


@runtime_checkable
class WeightLoadingPolicy(TrainablePolicy, Protocol):
    """Generates with weights of its own (another engine, another device), replaced by the
    trained ones after each update."""

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """Replace the generator's weights; ``weights`` are ``(name, tensor)`` under the base
        model's parameter names."""


@runtime_checkable
class AdapterLoadingPolicy(WeightLoadingPolicy, Protocol):
    """A :class:`WeightLoadingPolicy` that also serves LoRA adapters by name (``lora_per_agent``:
    the base weights stay, each agent's adapter is replaced after each update)."""

    def load_adapter(self, name: str, folder: Any) -> None:
        """Add or replace the adapter ``name`` from a PEFT adapter folder; requests naming it in
        ``metadata[ADAPTER_KEY]`` are then generated with it."""
