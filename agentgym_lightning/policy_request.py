"""The request the policy is sent: the agent's call as recorded, rewritten for the generator.

A trajectory keeps every call exactly as the agent sent it (``step.request``). What the policy
generates from may differ from it in four ways, and each is written here, always on a copy:

- its **seed** (:func:`seeded`): with ``AgentEnv(seed_calls=True)`` (the trainer's rollouts), a
  call the agent did not seed gets one derived from its episode's seed and its index
  (:func:`call_seed`), so a rollout samples the same however its calls were batched. The env
  applies it as it makes the observation: the episode's seed and the call's index are its own.
- its **episode** (:func:`tagged`, ``metadata[EPISODE_KEY]``): the batched driver names each
  request's episode as it hands a batch to the policy, so a policy with several replicas keeps an
  episode's calls on one of them (its prefix cache).
- its **sampling** (:func:`resampled`): the trainer's rollouts sample at the run's temperature and
  top-p with ``max_tokens`` capped, whatever the agent asked for (an agent written for deployment
  often asks for ``temperature=0``, which would make a group's episodes identical);
  :class:`~agentgym_lightning.training.generation.SamplingOverride` applies it to every request a
  wrapped policy answers.
- its **adapter** (:func:`routed`, ``metadata[ADAPTER_KEY]``): under ``lora_per_agent`` each call
  is generated with its agent's LoRA adapter;
  :class:`~agentgym_lightning.training.agent_adapters.AdapterRouting` applies it.

The first two are applied between the episode and the driver's batch, the last two by policy
wrappers at the generator (so a policy served to other processes applies them too); all four
rules live in this one module.
"""

from __future__ import annotations

import dataclasses
import hashlib

from agentgym_lightning.llm import ADAPTER_KEY, EPISODE_KEY, ChatRequest

__all__ = ["call_seed", "seeded", "tagged", "resampled", "routed"]


def call_seed(episode_seed: int | None, call_index: int) -> int:
    """The sampling seed of call ``call_index`` of an episode seeded ``episode_seed`` (a stable
    hash, so the same episode always samples the same way)."""
    digest = hashlib.blake2b(f"{episode_seed}:{call_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF


def seeded(request: ChatRequest, episode_seed: int | None, call_index: int) -> ChatRequest:
    """``request`` sampled with :func:`call_seed`, unless the agent chose a seed (kept)."""
    if request.sampling.seed is not None:
        return request
    seed = call_seed(episode_seed, call_index)
    return dataclasses.replace(request, sampling=dataclasses.replace(request.sampling, seed=seed))


def tagged(request: ChatRequest, episode_id: str | None) -> ChatRequest:
    """``request`` naming its episode in ``metadata[EPISODE_KEY]`` (unchanged when it already
    does, or when there is no episode)."""
    if episode_id is None or request.metadata.get(EPISODE_KEY) == episode_id:
        return request
    return dataclasses.replace(request, metadata={**request.metadata, EPISODE_KEY: episode_id})


def resampled(request: ChatRequest, *, temperature: float | None, top_p: float = 1.0, max_tokens: int | None = None) -> ChatRequest:
    """``request`` sampled at ``temperature`` (``None``: the request's own, and its top-p too) and
    ``top_p`` (``1.0``: the backend's default, no top-p), with at most ``max_tokens`` tokens
    (``None``: the request's own limit). Its seed and other options are kept."""
    s = request.sampling
    limit = s.max_tokens
    if max_tokens is not None:
        limit = max_tokens if limit is None else min(limit, max_tokens)
    if temperature is None:
        sampling = dataclasses.replace(s, max_tokens=limit)
    else:
        sampling = dataclasses.replace(s, temperature=temperature, top_p=None if top_p == 1.0 else top_p, max_tokens=limit)
    return dataclasses.replace(request, sampling=sampling)


def routed(request: ChatRequest, adapter: str) -> ChatRequest:
    """``request`` generated with the LoRA adapter ``adapter`` (``metadata[ADAPTER_KEY]``)."""
    return dataclasses.replace(request, metadata={**request.metadata, ADAPTER_KEY: adapter})
