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
* Asynchronous training (``max_staleness`` >= 1): :class:`VersionStamping` stamps every answer
  with the policy version that gave it (``Step.policy_version``), and :func:`separate_generator`
  gives an ``hf`` policy weights of its own (a copy of the model, one more model's worth of
  memory; under ``lora_per_agent`` a copy of the adapters on the shared frozen base), which
  :func:`sync_weights` then refreshes between two decode steps.
* :func:`generator_metrics`: what the generator counts per step (``generator/stale_answers``: answers a
  served generator wrote with other weights than the last pushed, refused; an ``hf`` generator's
  prompt tokens, those it prefilled and its prefix cache, from :func:`generator_counts` at the step's start).
"""

from __future__ import annotations

import contextlib
import copy
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

from agentgym_lightning.llm import ChatRequest, Completion
from agentgym_lightning.policies.base import AdapterLoadingPolicy, ModelSharingPolicy, Policy, RewritingPolicy, WeightLoadingPolicy
from agentgym_lightning.policy_request import resampled

__all__ = [
    "SamplingOverride", "VersionStamping", "sync_weights", "shares_model", "separate_generator", "merged_weights", "generator_metrics",
    "generator_counts",
]


class SamplingOverride(RewritingPolicy):
    """Answers with ``policy``, sampling every request at ``temperature``/``top_p`` (``None``: each
    request's own) and at most ``max_tokens`` tokens (``None``: the request's own limit). Seeds in
    the request are kept. Has ``submit`` when ``policy`` has."""

    def __init__(self, policy: Any, *, temperature: float | None, top_p: float = 1.0, max_tokens: int | None = None) -> None:
        super().__init__(policy)
        self.temperature = None if temperature is None else float(temperature)
        self.top_p = float(top_p)
        self.max_tokens = max_tokens

    def rewrite(self, request: ChatRequest) -> ChatRequest:
        return resampled(request, temperature=self.temperature, top_p=self.top_p, max_tokens=self.max_tokens)


class VersionStamping(Policy):
    """Answers with ``policy``, stamping each :class:`~agentgym_lightning.llm.Completion` with
    :attr:`version` as it was when the call was handed over (``Completion.policy_version``, which
    the episode records as ``Step.policy_version``). The trainer sets :attr:`version` to the
    number of updates the generator's weights have seen, after each sync; a call whose decode
    spans a sync is stamped with the older version (its staleness is never understated). Has
    ``submit`` when ``policy`` has."""

    def __init__(self, policy: Any, version: int = 0) -> None:
        self.policy = policy
        self.version = version
        self.backend = getattr(policy, "backend", "")
        self.model = getattr(policy, "model", "")

    def generate(self, requests: Sequence[ChatRequest]) -> list[Completion]:
        version = self.version
        generate = self.policy.generate if hasattr(self.policy, "generate") else self.policy
        return [_stamped(answer, version) for answer in generate(requests)]

    @property
    def submit(self) -> Any:  # a property: absent (AttributeError) when the wrapped policy has none
        """The wrapped policy's ``submit``, its answer stamped."""
        inner = getattr(self.policy, "submit", None)
        if not callable(inner):
            raise AttributeError(f"{type(self.policy).__name__} has no submit: it answers batches (generate)")

        def submit(request: ChatRequest) -> Future[Any]:
            version = self.version
            future = inner(request)
            # Registered before the driver's own callback: the answer is stamped when it reads it.
            future.add_done_callback(lambda f: None if f.cancelled() or f.exception() is not None else _stamped(f.result(), version))
            return future

        return submit


def _stamped(answer: Any, version: int) -> Any:
    if isinstance(answer, Completion):
        answer.policy_version = version
    return answer


def shares_model(policy: Any, model: Any) -> bool:
    """Whether ``policy`` generates with ``model`` itself (the ``hf`` backend: no copy, no sync)."""
    return isinstance(policy, ModelSharingPolicy) and policy.hf_model is model


def separate_generator(policy: Any, model: Any, *, share_frozen: bool = False) -> None:
    """Give ``policy`` (an ``hf`` policy generating with ``model`` itself) a copy of ``model`` to
    generate with, so the trainer can update ``model`` while episodes run; :func:`sync_weights`
    copies the trained weights into it, between two decode steps. Costs one more copy of the
    model's weights (with one LoRA too: the copy holds the merged base weights, no adapter).
    ``share_frozen``: the copy shares ``model``'s frozen parameters instead (an adapter per agent,
    ``lora_per_agent``: the base weights never change, and the copy holds its own copy of every
    adapter, routed per call as on ``model``): it costs the adapters' weights only."""
    if not callable(getattr(policy, "paused", None)):
        raise TypeError(f"the {getattr(policy, 'backend', type(policy).__name__)!r} policy cannot pause its decoding for a weight copy (no paused())")
    shared = {id(p): p for p in model.parameters() if not p.requires_grad} if share_frozen else {}
    generator = copy.deepcopy(model, memo=shared)
    generator.requires_grad_(False)
    generator.eval()
    policy.hf_model = generator


def _copy_into(target: Any, weights: Iterable[tuple[str, Any]]) -> None:
    """Copy ``(name, tensor)`` pairs into ``target``'s tensors of those names, in place."""
    import torch

    own = target.state_dict()
    with torch.no_grad():
        for name, tensor in weights:
            if name not in own:
                raise ValueError(f"the generator's copy has no weight {name!r}: it is not a copy of the trained model")
            own[name].copy_(tensor)


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
    the policy shares the model; an ``hf`` copy of its own, :func:`separate_generator`, is
    copied into between two decode steps). ``adapters``: push these LoRA adapters of ``model`` (saved as
    PEFT folders), each under its name, instead of merged weights."""
    if shares_model(policy, model):
        return 0.0
    if isinstance(policy, ModelSharingPolicy) and callable(getattr(policy, "paused", None)):
        start = time.perf_counter()  # a generator copy of its own (separate_generator)
        if adapters:  # its copy of every adapter, on the base it shares
            with policy.paused():
                _copy_into(policy.hf_model, ((n, t.detach()) for n, t in model.state_dict().items() if "lora_" in n))
        else:
            with merged_weights(model, peft) as weights, policy.paused():
                _copy_into(policy.hf_model, weights)
        return time.perf_counter() - start
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


def generator_counts(policy: Any) -> dict[str, float]:
    """The generator's running counts (an ``hf`` policy's
    :meth:`~agentgym_lightning.policies.hf.HFPolicy.prefill_stats`; nothing for the others): read at
    a step's start, :func:`generator_metrics` reports the step's share of them."""
    stats = getattr(policy, "prefill_stats", None)
    return dict(stats()) if callable(stats) else {}


def generator_metrics(policy: Any, since: dict[str, float] | None = None) -> dict[str, float]:
    """The generator's own counters for a step's metrics: ``generator/stale_answers`` (answers of a
    served generator written by other weights than the last pushed, refused) for a backend that
    checks versions (``vllm-server``); for an ``hf`` generator, since ``since`` (its
    :func:`generator_counts` at the step's start), ``generator/prompt_tokens``,
    ``generator/prefilled_tokens`` (computed, not reused), ``generator/prefilled_share`` (their
    ratio), ``generator/prefix_cache_hits``, and the cache's size now, ``generator/prefix_cache_mb``."""
    metrics: dict[str, float] = {}
    stale = getattr(policy, "stale_answers", None)
    if stale is not None:
        metrics["generator/stale_answers"] = float(stale)
    now = generator_counts(policy)
    if now:
        before = since or {}
        step = {k: now[k] - before.get(k, 0.0) for k in ("prompt_tokens", "prefilled_tokens", "prefix_cache_hits")}
        metrics.update({f"generator/{k}": v for k, v in step.items()})
        if step["prompt_tokens"]:
            metrics["generator/prefilled_share"] = step["prefilled_tokens"] / step["prompt_tokens"]
        metrics["generator/prefix_cache_mb"] = now["prefix_cache_mb"]
    return metrics
