"""What a run trains with, built in one place for the RL and the SFT trainer: the generator, the
trained model (with ``init_from``'s weights, its LoRA, activation checkpointing, sharded over the
ranks of the update), the reference model, the optimizer and its scheduler."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from agentgym_lightning.cpu_threads import warn_if_threads_spin

from agentgym_lightning.policies.base import ModelSharingPolicy, Policy
from agentgym_lightning.training.agent_adapters import AgentAdapters, adapter_parameters, add_agent_adapters
from agentgym_lightning.training.generation import separate_generator, shares_model
from agentgym_lightning.training.initial_weights import find_initial_weights
from agentgym_lightning.training.models import (
    AdapterReference,
    add_lora,
    build_optimizer,
    build_policy,
    enable_activation_checkpointing,
    reference_model,
)
from agentgym_lightning.training.ranks import Ranks
from agentgym_lightning.training.run_config import RunConfig

__all__ = ["RunModels", "build_run_models", "seed_process"]


def seed_process(seed: int, num_threads: int | None) -> None:
    """Seed Python's, NumPy's and torch's generators with the run's ``seed`` and set torch's CPU
    threads (``None``: torch's own), before anything is built: a run is a function of its seed."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    warn_if_threads_spin(torch.get_num_threads())  # torch imported before this package: no OMP_WAIT_POLICY


@dataclass
class RunModels:
    """What :func:`build_run_models` built for a run."""

    policy: Any
    #: The trained model (the hf policy's own; with LoRA, the PEFT model the policy generates through).
    model: Any
    tokenizer: Any
    #: lora_per_agent: which agent's calls go to which adapter (``None``: one set of trained weights).
    adapters: AgentAdapters | None
    pad_token_id: int
    #: The reference model of the KL term (the loss options' ``beta`` > 0), sharded as the model is; else ``None``.
    ref_model: Any
    #: Each adapter's parameters (lora_per_agent: clipped and reported per adapter).
    adapter_params: dict[str, list[torch.nn.Parameter]]
    optimizer: torch.optim.Optimizer
    scheduler: Any
    #: Whether the weights came from ``init_from`` (a generator of its own must get them).
    initialized: bool


def build_run_models(
    config: RunConfig, policy: Policy | None = None, *, training_steps: int, ranks: Ranks | None = None
) -> RunModels:
    """The generator (``policy``, or :func:`build_policy`; rank 0's alone on N ``ranks``), the
    trained model with ``init_from``'s weights, dropout off, its LoRA (one adapter, or one per
    agent), activation checkpointing, the reference model (``config.loss_options.beta`` > 0),
    both sharded over the ``ranks`` (FSDP2; one rank: as they are), the optimizer over the trained
    weights and the scheduler over ``training_steps`` optimizer steps. When ``config.asynchronous``
    (RL's ``max_staleness`` >= 1) an ``hf`` generator gets a copy of its own (episodes decode on while the update changes the model;
    under ``lora_per_agent`` a copy of the adapters on the shared frozen base),
    and a ``vllm-server`` one accepts answers from weights pushed during the call."""
    ranks = ranks if ranks is not None else Ranks()
    policy = policy if policy is not None or not ranks.is_main else build_policy(config)
    model, tokenizer = ranks.trained_model(policy, config)
    initial = find_initial_weights(config.init_from) if config.init_from else None
    if initial is not None:
        initial.load_base(model)
    own_pad = policy.pad_token_id if isinstance(policy, ModelSharingPolicy) else None
    pad_token_id = ranks.from_main(int(own_pad or tokenizer.pad_token_id or tokenizer.eos_token_id))
    from trl.trainer.utils import disable_dropout_in_model

    disable_dropout_in_model(model)
    adapters = AgentAdapters.from_config(config)
    if config.asynchronous and shares_model(policy, model) and adapters is None:
        separate_generator(policy, model)
    elif config.asynchronous and hasattr(policy, "syncs_during_calls"):
        policy.syncs_during_calls = True  # a served generator checking its answers' weights (vllm-server): syncs come mid-call
    if config.use_peft:
        shared = shares_model(policy, model)
        model = add_lora(model, config) if adapters is None else add_agent_adapters(model, config, adapters.names)
        if shared:
            policy.hf_model = model  # type: ignore[attr-defined] - the policy generates through the adapter
            if config.asynchronous and adapters is not None:
                separate_generator(policy, model, share_frozen=True)  # every adapter, on the one (frozen) base
    if initial is not None:
        initial.load_adapters(model, peft=config.use_peft, adapters=adapters.names if adapters is not None else None)
    if config.gradient_checkpointing:
        enable_activation_checkpointing(model)
    ref_model = reference_model(model, config) if config.loss_options.beta > 0 else None
    model, ref_model = ranks.shard(model, ref_model)  # N ranks: FSDP2
    if ref_model is not None and config.use_peft and initial is not None and initial.holds_adapters:
        ref_model = AdapterReference(model)  # the KL is to the adapters the run starts from, not to the base
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(params, config)
    from transformers import get_scheduler

    scheduler = get_scheduler(config.lr_scheduler_type, optimizer, num_warmup_steps=config.warmup_steps, num_training_steps=training_steps)
    return RunModels(
        policy=policy, model=model, tokenizer=tokenizer, adapters=adapters, pad_token_id=pad_token_id, ref_model=ref_model,
        adapter_params=adapter_parameters(model, adapters.names) if adapters is not None else {},
        optimizer=optimizer, scheduler=scheduler, initialized=initial is not None,
    )
