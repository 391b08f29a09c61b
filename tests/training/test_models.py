"""The models a run builds (:mod:`agentgym_lightning.training.models`): activation checkpointing
through transformers' current API."""

from __future__ import annotations

import importlib.util
import warnings
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs the train extra (make setup)")


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, max_position_embeddings=64)
    return LlamaForCausalLM(config).float()


def _gradients(model):
    model.zero_grad(set_to_none=True)
    model.train()
    ids = torch.arange(1, 17).reshape(2, 8) % 48
    model(input_ids=ids, use_cache=False).logits.logsumexp(-1).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("lora", [False, True])
def test_activation_checkpointing_uses_the_current_api_and_keeps_the_gradients(lora):
    """``gradient_checkpointing`` turned on without transformers' deprecation warning (before:
    "`gradient_checkpointing_enable` is deprecated and will be removed in v6"), every decoder
    layer checkpointed, and the gradients those of the model without it (LoRA too: its frozen
    base still passes gradients through a checkpointed layer)."""
    from agentgym_lightning.training.models import add_lora, enable_activation_checkpointing

    model = _tiny_llama()
    if lora:
        model = add_lora(model, SimpleNamespace(lora_r=4, lora_alpha=8, lora_dropout=0.0, lora_target_modules="all-linear"))
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0.0, 0.5)
    plain = _gradients(model)
    assert plain
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        enable_activation_checkpointing(model)
    layers = [m for m in model.modules() if type(m).__name__ == "LlamaDecoderLayer"]
    assert len(layers) == 2 and all(layer.gradient_checkpointing for layer in layers)
    checkpointed = _gradients(model)
    assert checkpointed.keys() == plain.keys()
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_lora_adapters_are_added_without_peft_reading_the_deprecated_checkpointing_flag_and_other_warnings_still_show(monkeypatch):
    """Before: every LoRA run printed transformers' "`is_gradient_checkpointing` is deprecated"
    FutureWarning: PEFT's constructor reads that property, and no PEFT API avoids it. That one
    warning is ignored where PEFT builds the model, and nothing else is."""
    import peft

    from agentgym_lightning.training.agent_adapters import add_agent_adapters
    from agentgym_lightning.training.models import add_lora

    lora = SimpleNamespace(lora_r=4, lora_alpha=8, lora_dropout=0.0, lora_target_modules="all-linear")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        add_lora(_tiny_llama(), lora)
        add_agent_adapters(_tiny_llama(), lora, ["writer", "rewriter"])

    real = peft.get_peft_model

    def also_warning(model, config, adapter_name="default"):
        warnings.warn("something else is deprecated", FutureWarning)
        return real(model, config, adapter_name=adapter_name)

    monkeypatch.setattr(peft, "get_peft_model", also_warning)
    with pytest.warns(FutureWarning, match="something else is deprecated") as caught:
        add_lora(_tiny_llama(), lora)
    assert [str(w.message) for w in caught] == ["something else is deprecated"]
