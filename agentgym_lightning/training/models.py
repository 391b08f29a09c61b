"""The models a run builds from its config: the generator, the model it trains (with its LoRA),
the frozen KL reference, and the optimizer over the trained weights. :func:`build_run_models`
builds them all in order (the RL and SFT trainers' both), starting from ``init_from``'s weights
when the config names a run (:mod:`.initial_weights`).

With the ``hf`` backend the generator and the trained model are one object (the policy's own
model, trained in place); a backend that holds its weights elsewhere (``vllm``) gets a fresh copy
of them to train, and the new weights after every update (:mod:`.generation`).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch

from agentgym_lightning.policies.base import ModelSharingPolicy, Policy, TrainablePolicy
from agentgym_lightning.training.agent_adapters import AgentAdapters, lora_config, with_lora
from agentgym_lightning.training.run_config import RunConfig

__all__ = [
    "build_policy", "trainable_model", "add_lora", "enable_activation_checkpointing", "reference_model", "AdapterReference",
    "build_optimizer",
]


def build_policy(config: RunConfig) -> Any:
    """The generator of ``config.backend`` for ``config.model``, with the run's device, dtype,
    seed and threads (``policy_kwargs`` win), and under ``lora_per_agent`` room for every adapter."""
    from agentgym_lightning.policies import make_policy

    kwargs = dict(config.policy_kwargs)
    if config.backend == "hf":
        kwargs.setdefault("device", config.device)
        kwargs.setdefault("dtype", config.dtype)
        kwargs.setdefault("seed", config.seed)
        if config.num_threads is not None:
            kwargs.setdefault("num_threads", config.num_threads)
    elif config.backend == "vllm-server":  # its LoRA slots are the server's (--max-loras)
        kwargs.setdefault("seed", config.seed)
        kwargs.setdefault("generator_url", config.generator_url)
    else:
        kwargs.setdefault("seed", config.seed)
        if config.lora_per_agent is not False:  # vLLM multi-LoRA: one adapter per trained agent in a batch
            kwargs.setdefault("max_loras", len(AgentAdapters.from_config(config).names))  # type: ignore[union-attr]
            kwargs.setdefault("max_lora_rank", max(8, 1 << (config.lora_r - 1).bit_length()))  # vLLM takes 8, 16, 32...
    return make_policy(config.backend, config.model, **kwargs)


def trainable_model(policy: Policy, config: RunConfig) -> tuple[Any, Any]:
    """The model to train and its tokenizer: the hf policy's own model, or a fresh copy of the
    generator's weights for a backend that holds them elsewhere."""
    if isinstance(policy, ModelSharingPolicy) and policy.hf_model is not None:
        return policy.hf_model, policy.tokenizer
    if not isinstance(policy, TrainablePolicy):
        raise TypeError(
            f"cannot train the {getattr(policy, 'backend', type(policy).__name__)!r} policy: it holds no weights "
            "(use the hf or vllm backend)"
        )
    from transformers import AutoModelForCausalLM

    device = "cuda" if config.device == "auto" and torch.cuda.is_available() else ("cpu" if config.device == "auto" else config.device)
    dtype = getattr(torch, config.dtype) if config.dtype != "auto" else (torch.bfloat16 if device.startswith("cuda") else torch.float32)
    model = AutoModelForCausalLM.from_pretrained(policy.path, dtype=dtype).to(device)
    return model, policy.tokenizer


def add_lora(model: Any, config: RunConfig) -> Any:
    """``model`` with the config's LoRA adapter (PEFT), the only weights trained."""
    return with_lora(model, lora_config(config))


def enable_activation_checkpointing(model: Any) -> None:
    """Recompute each layer's activations in the backward instead of keeping them
    (``gradient_checkpointing``), non-reentrant (the only kind that works with frozen LoRA bases):
    transformers 5's ``activation_checkpointing_enable``; 4.x, which has only
    ``gradient_checkpointing_enable`` (deprecated by 5, with a FutureWarning), through that."""
    kwargs = {"use_reentrant": False}
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def reference_model(model: Any, config: RunConfig) -> Any:
    """The KL reference: LoRA needs none (the adapter is switched off; a LoRA run started from
    adapters takes an :class:`AdapterReference` once sharded); full fine-tuning keeps a frozen
    copy of the initial weights."""
    if config.use_peft:
        return model
    ref = copy.deepcopy(model)
    ref.requires_grad_(False)
    ref.eval()
    return ref


class AdapterReference:
    """The KL reference of a LoRA run that started from another run's adapters (``init_from``):
    the trained model with its adapters' initial weights, swapped in for the reference's forward
    only. Switching the adapters off, LoRA's reference otherwise, would give the base model, not
    the policy the run started from. Holds one copy of the trainable weights (the adapters, each
    rank its shards), not of the model. Build it after the initial weights are loaded (and the
    model sharded); a resumed run builds it before loading its checkpoint, so it stays the start."""

    def __init__(self, model: Any) -> None:
        from torch.distributed.fsdp import FSDPModule

        self.model = model
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._initial = [p.detach().clone() for p in self._params]
        self._sharded = [m for m in model.modules() if isinstance(m, FSDPModule)]

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[Any]:
        """The model with the initial adapter weights, its trained ones restored on leaving."""
        with torch.no_grad():
            trained = [p.detach().clone() for p in self._params]
            self._write(self._initial)
        try:
            yield self.model
        finally:
            with torch.no_grad():
                self._write(trained)

    def _write(self, weights: list[torch.Tensor]) -> None:
        for param, value in zip(self._params, weights):
            param.copy_(value)
        # Sharded (FSDP2): the root unit keeps its parameters gathered after a forward; drop every
        # gathered copy so the next forward gathers the weights just written.
        for module in self._sharded:
            module.reshard()


def build_optimizer(params: list[torch.nn.Parameter], config: RunConfig) -> torch.optim.Optimizer:
    """``config.optim`` over ``params``."""
    if config.optim == "adafactor":
        from torch.distributed.tensor import DTensor
        from transformers.optimization import Adafactor

        # A fixed learning rate (the scheduler's to change), no first moment: the state is a row
        # and a column of second moments per matrix, so a full fine-tune holds no copy of the
        # weights' size (AdamW holds two).
        sharded = any(isinstance(p, DTensor) for p in params)
        return (_sharded_adafactor() if sharded else Adafactor)(
            params, lr=config.learning_rate, beta1=None, weight_decay=config.weight_decay,
            scale_parameter=False, relative_step=False, warmup_init=False,
        )
    # The fused kernel is ~5x faster than the default per-tensor loop on CPU (1.6 s vs 8.3 s per
    # step for 135M parameters on 2 cores) and exists for CUDA too.
    return torch.optim.AdamW(
        params, lr=config.learning_rate, betas=(config.adam_beta1, config.adam_beta2), eps=config.adam_epsilon,
        weight_decay=config.weight_decay, fused=all(p.dtype.is_floating_point for p in params),
    )


def _sharded_adafactor() -> type[torch.optim.Optimizer]:
    """transformers' Adafactor over FSDP2's sharded (DTensor) parameters, on N ranks.

    Its step needs a whole matrix (a row's and a column's mean, the update's RMS over every
    element) and keeps plain-tensor state, so on shards it fails at the first update ("got mixed
    torch.Tensor and DTensor"). Here each parameter steps on its whole tensor, gathered one at a
    time (a collective: every rank runs the same ones in the same order), every rank computing the
    same update from the same numbers, and keeps its own shard of the result: the one-rank update,
    with the state (a row and a column per matrix) whole on every rank, as small as on one."""
    from torch.distributed.tensor import DTensor, distribute_tensor
    from transformers.optimization import Adafactor

    class ShardedAdafactor(Adafactor):
        @torch.no_grad()
        def step(self, closure: Any = None) -> Any:
            loss = closure() if closure is not None else None
            groups = [group["params"] for group in self.param_groups]
            try:
                for index, params in enumerate(groups):
                    for param in params:
                        if param.grad is None:
                            continue
                        if not isinstance(param, DTensor):
                            self._step_one(index, param)
                            continue
                        whole = param.full_tensor()
                        whole.grad = param.grad.full_tensor()
                        state = self.state.pop(param, {})
                        # A checkpoint restored by Ranks.restore shards a state tensor of the
                        # parameter's shape (a vector's second moments): whole again here.
                        self.state[whole] = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in state.items()}
                        try:
                            self._step_one(index, whole)
                        finally:
                            self.state[param] = self.state.pop(whole)
                        mine = distribute_tensor(whole, param.device_mesh, param.placements, src_data_rank=None)
                        param.to_local().copy_(mine.to_local())  # src_data_rank=None: this rank's slice, no communication
            finally:
                for group, params in zip(self.param_groups, groups):
                    group["params"] = params
            return loss

        def _step_one(self, index: int, param: torch.Tensor) -> None:
            """Adafactor's step on ``param`` alone, with its group's options."""
            for i, group in enumerate(self.param_groups):
                group["params"] = [param] if i == index else []
            Adafactor.step(self)

    return ShardedAdafactor
