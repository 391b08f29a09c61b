"""What a run will hold per rank, said before the first step, and a plan that cannot fit refused.

An update's memory is mostly known before it starts: the weights, their gradients and the
optimizer's state (all three split N ways by FSDP on N ranks, :mod:`.ranks`), a full fine-tune's
frozen KL reference (a LoRA run started from adapters: a copy of those), and the generator where
it shares the trainer's device (rank 0). The plan is counted from the model's config on PyTorch's
``meta`` device (no weight is loaded) and compared with what the device has free (CPU: the RAM
available, shared by the node's ranks; CUDA: the device's free memory). A plan that cannot fit is
refused with the options that shrink it, instead of an out-of-memory error an hour in.

Activations are estimated apart (:func:`activation_bytes`): the peak of live tensors in one
micro-batch as long as ``micro_batch_tokens``, from the model's widths (checked against
``bench/bench_activations.py``'s measure). The process's RSS can be well above it (what the
allocator keeps; docs/training.md). A micro-batch is often shorter than its bound (short
rows, few of them), so activations that cannot fit are a warning
(:class:`ActivationMemoryWarning`) naming the ways to shrink them, not a refusal.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from agentgym_lightning.training.initial_weights import find_initial_weights
from agentgym_lightning.training.run_config import RunConfig
from agentgym_lightning.training.token_tree import VOCAB_TILE, packed_unsupported_reason, plain_lm_head

__all__ = ["ActivationMemoryWarning", "MemoryPlan", "MemoryPlanError", "activation_bytes", "plan_memory", "available_memory"]

_GIB = 2**30


class MemoryPlanError(MemoryError):
    """The run's plan needs more memory per rank than its device has."""


class ActivationMemoryWarning(ResourceWarning):
    """The run's state fits, but with one micro-batch's activations at ``micro_batch_tokens`` it
    does not: a micro-batch that long may run out of memory."""


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
    #: The live peak of one micro-batch of ``activation_tokens``, estimated
    #: (:func:`activation_bytes`); ``None`` when no bound is set (``micro_batch_tokens=None``).
    activations: int | None = None
    #: The micro-batch bound the activations are counted at (``micro_batch_tokens``).
    activation_tokens: int | None = None

    @property
    def total(self) -> int:
        """The state the run holds throughout: everything but the activations."""
        return self.weights + self.gradients + self.optimizer + self.reference + self.generator

    @property
    def total_with_activations(self) -> int | None:
        return None if self.activations is None else self.total + self.activations

    def describe(self) -> str:
        """The plan in one line per part, as the trainer prints it."""
        parts = [("weights", self.weights), ("gradients", self.gradients), ("optimizer state", self.optimizer)]
        if self.reference:
            parts.append(("KL reference", self.reference))
        if self.generator:
            parts.append(("generator copy (rank 0)", self.generator))
        lines = [f"memory per rank ({self.ranks} rank{'s' if self.ranks > 1 else ''}, {self.device}):"]
        lines += [f"  {name:<24} {size / _GIB:8.2f} GiB" for name, size in parts]
        free = f"{self.available / _GIB:.2f} GiB available" if self.available is not None else "available memory unknown"
        lines.append(f"  {'total before activations':<24} {self.total / _GIB:8.2f} GiB of {free}")
        if self.activations is None:
            lines.append("  activations              unbounded (micro_batch_tokens=None: a micro-batch is as long as its rows)")
        else:
            lines.append(f"  {'activations':<24} {self.activations / _GIB:8.2f} GiB at most, a micro-batch of "
                         f"{self.activation_tokens:,} tokens (estimated)")
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

    def warn_about_activations(self) -> None:
        """Warn (:class:`ActivationMemoryWarning`) when the state fits but a micro-batch at its
        bound would not: whether one gets that long depends on the rows, which are not known yet."""
        full = self.total_with_activations
        if self.available is None or full is None or full <= self.available:
            return
        warnings.warn(
            f"a micro-batch of {self.activation_tokens:,} tokens holds about {self.activations / _GIB:.2f} GiB of activations "
            f"at its peak; with the run's {self.total / _GIB:.2f} GiB that is {full / _GIB:.2f} GiB per rank, and "
            f"{self.device} has {self.available / _GIB:.2f} GiB. A micro-batch that long may run out of memory. To shrink "
            "it: --set gradient_checkpointing=true (keeps each layer's input only, recomputes the rest), a smaller "
            "--set micro_batch_tokens=N (activations grow with it; the loss is the same), or fewer rows per forward "
            "(--set per_device_train_batch_size=N)",
            ActivationMemoryWarning,
            stacklevel=2,
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


def _meta_model(config: RunConfig, path: str) -> Any:
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


def _optimizer_bytes(trainable: list[torch.nn.Parameter], optim: str, itemsize: int, ranks: int = 1) -> int:
    """One rank's optimizer state: AdamW's split ``ranks`` ways as the weights are; Adafactor's
    whole on every rank (it steps each matrix whole, :func:`.models.build_optimizer`), plus, on N
    ranks, the largest trained tensor and its gradient gathered whole for its step."""
    if optim == "adafactor":  # a row and a column of second moments per matrix (fp32), a vector's own size
        state = sum(4 * (p.shape[0] + p.shape[1]) if p.dim() == 2 else 4 * p.numel() for p in trainable)
        return state + (2 * itemsize * max((p.numel() for p in trainable), default=0) if ranks > 1 else 0)
    return -(-2 * itemsize * sum(p.numel() for p in trainable) // ranks)  # AdamW: two moments in the weights' dtype


def activation_bytes(
    model_config: Any, *, tokens: int, itemsize: int, tree: bool, gradient_checkpointing: bool, logit_positions: int,
    tiled_logits: bool, trained_head: bool, device: str = "cpu",
) -> int:
    """The peak bytes of one micro-batch of ``tokens`` token positions between its forward and the
    end of its backward, beyond the weights and their accumulated gradients, estimated from a dense
    decoder's widths (``model_config``: a transformers config) in weights of ``itemsize`` bytes.

    What autograd keeps, per token and layer: 4 MLP-width tensors (gate, its activation, up, their
    product), 6 hidden-width ones (each norm's input, normalised and scaled output) and the
    attention's query and output (2 of query width; the output is the projection's input) plus its
    key and value — repeated to the query's heads when the call has a mask and fewer key/value heads
    (transformers' sdpa path; counted always, as the bound). ``gradient_checkpointing`` keeps each
    layer's input instead and recomputes one layer at a time in the backward. The ``tree`` adds its
    one additive ``tokens x tokens`` mask. The logits of ``logit_positions``: computed whole, fp32,
    kept once, and about three more copies in the backward (softmax, gradient, temporaries);
    ``tiled_logits`` (TRL's chunked kernel) a vocabulary tile at a time, whose backward on a device without Triton (the CPU) holds
    about 8 fp32 temporaries of a tile. The backward starts with the head's weight gradient
    (``trained_head``: a full fine-tune), computed whole before it is added to the accumulated one.
    Against the peak of live tensors that ``bench/bench_activations.py`` measures on SmolLM2-135M:
    see docs/scaling.md. Mixture-of-experts layers and vision towers are not counted."""
    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    hidden = int(text.hidden_size)
    layers = int(text.num_hidden_layers)
    heads = int(getattr(text, "num_attention_heads", None) or 1)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text, "head_dim", None) or hidden // heads)
    intermediate = int(getattr(text, "intermediate_size", None) or getattr(text, "n_inner", None) or 4 * hidden)
    vocab = int(text.vocab_size)
    kv_width = heads * head_dim if kv_heads < heads else kv_heads * head_dim
    per_layer = 4 * intermediate + 6 * hidden + 2 * heads * head_dim + 2 * kv_width
    final_norm = 3 * hidden
    kept_per_token = (layers * hidden + per_layer + final_norm) if gradient_checkpointing else (layers * per_layer + final_norm)
    mask = tokens * tokens * itemsize if tree else 0
    if tiled_logits:  # trl.kernels.chunked_logprob: TOKEN_CHUNK_SIZE x chunk_size tiles (the update's VOCAB_TILE)
        copies = 8 if device.startswith("cpu") else 1
        logits = copies * min(logit_positions, 4096) * min(vocab, VOCAB_TILE) * 4
    else:
        logits = 4 * logit_positions * vocab * 4  # kept, its softmax, gradient and a temporary (measured: 2.9-3.7)
    head_gradient = vocab * hidden * itemsize if trained_head else 0
    return tokens * kept_per_token * itemsize + mask + logits + head_gradient


def plan_memory(config: RunConfig, path: str, *, ranks: int = 1, device: str = "cpu", available: int | None = None) -> MemoryPlan:
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
    elif config.backend == "hf" and config.asynchronous:
        # Asynchronous training gives the hf generator a copy to decode with while the update runs
        # (training/generation.py, separate_generator): the base weights, or under lora_per_agent
        # its own adapters on the shared frozen base.
        generator += trained if config.use_peft and config.lora_per_agent else base
    beta = config.loss_options.beta  # the KL term's: > 0 keeps a reference model
    reference = 0 if config.use_peft or beta <= 0 else weights
    activations = None
    if config.micro_batch_tokens is not None:
        tokens = config.micro_batch_tokens
        tree = config.packed_update is not False and packed_unsupported_reason(model) is None
        completion = config.max_completion_length
        completions = tokens if completion is None else config.per_device_train_batch_size * (completion + 1)
        head = model.get_output_embeddings()
        activations = activation_bytes(
            model.config, tokens=tokens, itemsize=itemsize, tree=tree, gradient_checkpointing=config.gradient_checkpointing,
            logit_positions=min(tokens, completions), tiled_logits=tree and ranks == 1 and plain_lm_head(model) is not None,
            trained_head=head is not None and head.weight.requires_grad, device=device,
        )
    if config.use_peft and beta > 0 and config.init_from and find_initial_weights(config.init_from).holds_adapters:
        reference = trained  # LoRA from adapters: a copy of their initial weights (models.AdapterReference)
    return MemoryPlan(
        ranks=ranks,
        device=device,
        weights=-(-weights // ranks),
        gradients=-(-trained // ranks),
        optimizer=_optimizer_bytes(trainable, config.optim, itemsize, ranks),
        reference=-(-reference // ranks),
        generator=generator,
        available=available if available is not None else available_memory(device),
        activations=activations,
        activation_tokens=config.micro_batch_tokens,
    )


def check_run_memory(config: RunConfig, policy: Any, *, ranks: int, device: torch.device | None, main: bool) -> MemoryPlan | None:
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
        if main:
            plan.warn_about_activations()
    return plan
