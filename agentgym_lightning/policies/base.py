"""The policy interface: what answers an environment's pending LLM calls; and what the trainer
needs of a policy whose weights it trains (:class:`TrainablePolicy` and its two kinds).

Two ways to hand a policy its calls:

* ``generate(requests) -> completions`` (:class:`Policy`, every backend): a batch in, its answers
  out. The simple path; a driver hands such a policy its calls through a
  :class:`~agentgym_lightning.policies.batching.BatchingPolicy`, which gathers them into batches
  (``max_batch_wait``), and a call that arrives while a batch runs waits for the whole batch.
* ``submit(request) -> Future[Completion]`` (:class:`SchedulingPolicy`, backends that schedule
  per decode step: ``hf``, ``vllm`` (its engine's scheduler), ``openai``/``vllm-server`` (sent at
  once; the server schedules)): one call in, as soon as it is made; the backend prefills it and
  lets it join its running batch at the next decode step, and resolves the future the moment that
  row ends. The batched driver uses ``submit`` when the policy has it (:func:`schedules_per_step`) and
  then never waits to fill a batch; it gives any other policy one (``BatchingPolicy``). A seeded request gets the same completion either way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from typing import Any, Protocol, runtime_checkable

from agentgym_lightning.llm import ChatRequest, Completion

__all__ = ["Policy", "SchedulingPolicy", "schedules_per_step", "RewritingPolicy", "TrainablePolicy", "ModelSharingPolicy", "WeightLoadingPolicy", "AdapterLoadingPolicy"]


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
class SchedulingPolicy(Protocol):
    """A policy that takes calls one at a time and schedules them per decode step (iteration-level
    scheduling): a submitted request joins the running batch at the next step and its future is
    resolved as soon as its row ends, whatever else is running.

    ``submit`` never blocks on generation; it may raise at once for a request it cannot plan
    (an unknown adapter, a bad temperature), else the future holds the :class:`Completion` (the
    same one :meth:`Policy.generate` gives for a seeded request) or the exception generating it
    raised. Thread-safe. A policy that has ``submit`` keeps ``generate`` (the batch path)."""

    def submit(self, request: ChatRequest) -> Future[Completion]:
        """Start answering ``request``; the future resolves to its completion."""
        ...


def schedules_per_step(policy: Any) -> bool:
    """Whether ``policy`` takes calls one at a time (has a callable ``submit``): the driver
    hands it each call as it comes instead of batching."""
    return callable(getattr(policy, "submit", None))


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


class RewritingPolicy(Policy):
    """Answers with another policy, each request rewritten first (:meth:`rewrite`): the training
    wrappers (the run's sampling, an agent's adapter). It has ``submit`` exactly when the wrapped
    policy has, so a driver schedules through it as it would through the policy itself. It does
    not own the wrapped policy: ``close`` leaves it open."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.backend = getattr(policy, "backend", "")
        self.model = getattr(policy, "model", "")

    @abstractmethod
    def rewrite(self, request: ChatRequest) -> ChatRequest:
        """The request as the wrapped policy gets it."""

    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        generate = self.policy.generate if hasattr(self.policy, "generate") else self.policy
        return list(generate([self.rewrite(r) for r in requests]))

    @property
    def submit(self) -> Any:  # a property: absent (AttributeError) when the wrapped policy has none
        """The wrapped policy's ``submit``, each request rewritten (see :class:`SchedulingPolicy`)."""
        inner = getattr(self.policy, "submit", None)
        if not callable(inner):
            raise AttributeError(f"{type(self.policy).__name__} has no submit: it answers batches (generate)")
        return lambda request: inner(self.rewrite(request))
