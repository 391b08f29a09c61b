"""What a run will hold per rank, said before the first step, and a plan that cannot fit refused.

An update's memory is mostly known before it starts: the weights, their gradients and the
optimizer's state (all three split N ways by FSDP on N ranks, :mod:`.ranks`), a full fine-tune's
frozen KL reference (a LoRA run started from adapters: a copy of those), and the generator where
it shares the trainer's device (rank 0). The plan is counted from the model's config on PyTorch's
``meta`` device (no weight is loaded) and compared with what the device has free (CPU: the RAM
available, shared by the node's ranks; CUDA: the device's free memory). A plan that cannot fit is
refused with the options that shrink it, instead of an out-of-memory error an hour in.
Activations come on top; ``micro_batch_tokens`` bounds them.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from agentgym_lightning.training.config import LightningRLConfig
from agentgym_lightning.training.initial_weights import find_initial_weights

__all__ = ["MemoryPlan", "MemoryPlanError", "plan_memory", "available_memory"]

_GIB = 2**30


class MemoryPlanError(MemoryError):
    """The run's plan needs more memory per rank than its device has."""


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes held per rank (the largest: rank 0, which also holds the generator's copy)."""

    ranks: int
    device: str
    weights: int
    gradients: int
    optimizer: int
    reference: int
    generator: int
    #: Bytes the device has for one rank (``None``: unknown, nothing is refused).
    available: int | None

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.reference + self.generator

    def describe(self) -> str:
        """The plan in one line per part, as the trainer prints it."""
        parts = [("weights", self.weights), ("gradients", self.gradients), ("optimizer state", self.optimizer)]
        if self.reference:
            parts.append(("KL reference", self.reference))
        if self.generator:
            parts.append(("generator copy (rank 0)", self.generator))
        lines = [f"memory per rank ({self.ranks} rank{'s' if self.ranks > 1 else ''}, {self.device}), before activations:"]
        lines += [f"  {name:<24} {size / _GIB:8.2f} GiB" for name, size in parts]
        free = f"{self.available / _GIB:.2f} GiB available" if self.available is not None else "available memory unknown"
        lines.append(f"  {'total':<24} {self.total / _GIB:8.2f} GiB of {free}")
        return "\n".join(lines)

    def check(self) -> None:
        """Raise :class:`MemoryPlanError` naming the ways out when the plan cannot fit."""
        if self.available is None or self.total <= self.available:
            return
        raise MemoryPlanError(
            f"this run needs {self.total / _GIB:.2f} GiB per rank before activations (weights {self.weights / _GIB:.2f}, "
            f"gradients {self.gradients / _GIB:.2f}, optimizer state {self.optimizer / _GIB:.2f}, KL reference "
            f"{self.reference / _GIB:.2f}, generator {self.generator / _GIB:.2f}) but {self.device} has "
            f"{self.available / _GIB:.2f} GiB for it. Options: more ranks (--nproc-per-node N: weights, gradients and "
            "optimizer state split N ways), LoRA (--lora: gradients and optimizer state of the adapter only), Adafactor "
            "(--set optim=adafactor: no per-weight optimizer state), a separate generator (--backend vllm-server "
            "--generator-url URL: no generator on the trainer's device), or --set check_memory=false to try anyway"
        )


def available_memory(device: str) -> int | None:
    """Bytes free for this process on ``device``: CUDA's free memory on that device; for the CPU
    the RAM the kernel counts available (``MemAvailable``), shared by the node's ranks."""
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            return None
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    local_ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 // local_ranks
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // local_ranks
    except (OSError, ValueError, AttributeError):
        return None


def _meta_model(config: LightningRLConfig, path: str) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers' deprecations, raised by PEFT's wrapping
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
        if config.use_peft:
            from agentgym_lightning.training.agent_adapters import AgentAdapters, add_agent_adapters
            from agentgym_lightning.training.models import add_lora

            adapters = AgentAdapters.from_config(config)  # lora_per_agent: an adapter per agent, as the trainer adds them
            model = add_lora(model, config) if adapters is None else add_agent_adapters(model, config, adapters.names)
    return model


def _optimizer_bytes(trainable: list[torch.nn.Parameter], optim: str, itemsize: int) -> int:
    if optim == "adafactor":  # a row and a column of second moments per matrix (fp32), a vector's own size
        return sum(4 * (p.shape[0] + p.shape[1]) if p.dim() == 2 else 4 * p.numel() for p in trainable)
    return 2 * itemsize * sum(p.numel() for p in trainable)  # AdamW: two moments in the weights' dtype


def plan_memory(config: LightningRLConfig, path: str, *, ranks: int = 1, device: str = "cpu", available: int | None = None) -> MemoryPlan:
    """What a run of ``config`` on the model in ``path`` holds per rank on ``ranks`` ranks of
    ``device`` (``available``: the bytes free, measured by :func:`available_memory` when ``None``)."""
    model = _meta_model(config, path)
    dtype = getattr(torch, config.dtype) if config.dtype != "auto" else (torch.bfloat16 if device.startswith("cuda") else torch.float32)
    itemsize = torch.empty((), dtype=dtype).element_size()
    unique = {id(p): p for p in model.parameters()}.values()  # tied weights once
    trainable = [p for p in unique if p.requires_grad]
    weights = itemsize * sum(p.numel() for p in unique)
    # the weights a generator holds: a LoRA adapter merged in, its own weights are not kept
    base = itemsize * sum(p.numel() for p in unique if not (config.use_peft and p.requires_grad))
    trained = itemsize * sum(p.numel() for p in trainable)
    # A generator on the trainer's device: vLLM in-process holds its own copy; on N ranks rank 0
    # keeps the gathered copy (the hf generator's own model, a served generator's sync source).
    generator = base if config.backend == "vllm" else 0
    if ranks > 1:
        generator += base
    elif config.backend == "hf" and config.max_staleness:
        # Asynchronous training gives the hf generator a copy to decode with while the update runs
        # (training/generation.py, separate_generator): the base weights, or under lora_per_agent
        # its own adapters on the shared frozen base.
        generator += trained if config.use_peft and config.lora_per_agent else base
    reference = 0 if config.use_peft or config.beta <= 0 else weights
    if config.use_peft and config.beta > 0 and config.init_from and find_initial_weights(config.init_from).holds_adapters:
        reference = trained  # LoRA from adapters: a copy of their initial weights (models.AdapterReference)
    return MemoryPlan(
        ranks=ranks,
        device=device,
        weights=-(-weights // ranks),
        gradients=-(-trained // ranks),
        optimizer=-(-_optimizer_bytes(trainable, config.optim, itemsize) // ranks),
        reference=-(-reference // ranks),
        generator=generator,
        available=available if available is not None else available_memory(device),
    )


def check_run_memory(config: LightningRLConfig, policy: Any, *, ranks: int, device: torch.device | None, main: bool) -> MemoryPlan | None:
    """The trainer's check before it loads anything: the plan of this run (the model of
    ``policy``, or of ``config.model``), printed to stderr by rank 0, refused
    (:class:`MemoryPlanError`) when it cannot fit and ``config.check_memory`` is on. ``None`` when the
    model's config cannot be read here (an API backend's model)."""
    import sys

    from agentgym_lightning.policies.models import ModelNotFoundError, resolve_model

    where = str(device) if device is not None else config.device
    if where == "auto":
        where = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        path = str(getattr(policy, "path", None) or resolve_model(config.model, progress=False))
        plan = plan_memory(config, path, ranks=ranks, device=where)
    except (ModelNotFoundError, OSError, ValueError):
        return None
    if main:
        print(plan.describe(), file=sys.stderr)
    if config.check_memory:
        plan.check()
    return plan
