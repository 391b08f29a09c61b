"""The generator side of training: how rollouts sample, and how new weights reach the generator.

* :class:`SamplingOverride` wraps a policy so every call of a rollout is sampled the way training
  needs (the run's temperature and top-p, ``max_tokens`` capped), whatever the agent asked for —
  an agent written for deployment often asks for ``temperature=0``, which would make every episode
  of a group identical and teach nothing. The agent's own request stays in the trajectory as sent
  (the rewrite is :func:`~agentgym_lightning.policy_request.resampled`).
* :func:`sync_weights` pushes the trained weights to the generator after an update: nothing to
  do when the ``hf`` backend shares the trained model; a full push (LoRA merged in) for a backend
  with ``load_weights`` (``vllm``); with an adapter per agent (``lora_per_agent``), each adapter
  (the base weights never change) to a backend with ``load_adapter`` (``vllm`` multi-LoRA,
  ``vllm-server``: a running ``vllm serve``, through a shared folder and its reload routes).
* :func:`generator_metrics`: what the generator counts per step (``generator/stale_answers``: answers a
  served generator wrote with other weights than the last pushed, refused).
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

from agentgym_lightning.llm import ChatRequest
from agentgym_lightning.policies.base import AdapterLoadingPolicy, ModelSharingPolicy, RewritingPolicy, WeightLoadingPolicy
from agentgym_lightning.policy_request import resampled

__all__ = ["SamplingOverride", "sync_weights", "shares_model", "merged_weights", "generator_metrics"]


class SamplingOverride(RewritingPolicy):
    """Answers with ``policy``, sampling every request at ``temperature``/``top_p`` and at most
    ``max_tokens`` tokens (``None``: the request's own limit). Seeds in the request are kept.
    Has ``submit`` when ``policy`` has."""

    def __init__(self, policy: Any, *, temperature: float, top_p: float = 1.0, max_tokens: int | None = None) -> None:
        super().__init__(policy)
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.max_tokens = max_tokens

    def rewrite(self, request: ChatRequest) -> ChatRequest:
        return resampled(request, temperature=self.temperature, top_p=self.top_p, max_tokens=self.max_tokens)


def shares_model(policy: Any, model: Any) -> bool:
    """Whether ``policy`` generates with ``model`` itself (the ``hf`` backend: no copy, no sync)."""
    return isinstance(policy, ModelSharingPolicy) and policy.hf_model is model


@contextlib.contextmanager
def merged_weights(model: Any, peft: bool) -> Iterator[Iterator[tuple[str, Any]]]:
    """The weights a generator needs, under the base model's parameter names: with LoRA, the
    adapter is merged into the base weights for the duration (and unmerged after)."""
    if not peft:
        yield ((name, tensor.detach()) for name, tensor in model.state_dict().items())
        return
    model.merge_adapter()
    try:
        base = model.get_base_model()

        def named() -> Iterator[tuple[str, Any]]:
            for name, tensor in base.state_dict().items():
                if "lora_" in name:
                    continue
                yield name.replace(".base_layer", ""), tensor.detach()

        yield named()
    finally:
        model.unmerge_adapter()


def sync_weights(policy: Any, model: Any, *, peft: bool, adapters: Sequence[str] | None = None) -> float:
    """Push ``model``'s weights to ``policy``'s generator; returns the seconds it took (0 when
    the policy shares the model). ``adapters``: push these LoRA adapters of ``model`` (saved as
    PEFT folders), each under its name, instead of merged weights."""
    if shares_model(policy, model):
        return 0.0
    if adapters:
        if not isinstance(policy, AdapterLoadingPolicy):
            raise TypeError(
                f"the {getattr(policy, 'backend', type(policy).__name__)!r} policy cannot serve an adapter per agent "
                "(no load_adapter): train lora_per_agent with the hf or vllm backend"
            )
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="agentgym-adapters-") as folder:
            model.save_pretrained(folder, selected_adapters=list(adapters))
            for name in adapters:
                policy.load_adapter(name, f"{folder}/{name}")
        return time.perf_counter() - start
    if not isinstance(policy, WeightLoadingPolicy):
        raise TypeError(
            f"the {getattr(policy, 'backend', type(policy).__name__)!r} policy can neither share the trained "
            "model nor receive weights (no load_weights): train with the hf, vllm or vllm-server backend"
        )
    start = time.perf_counter()
    with merged_weights(model, peft) as weights:
        policy.load_weights(weights)
    return time.perf_counter() - start


def generator_metrics(policy: Any) -> dict[str, float]:
    """The generator's own counters for a step's metrics: ``generator/stale_answers`` (answers of a
    served generator written by other weights than the last pushed, refused) for a backend that
    checks versions (``vllm-server``); nothing for the others."""
    stale = getattr(policy, "stale_answers", None)
    return {} if stale is None else {"generator/stale_answers": float(stale)}
