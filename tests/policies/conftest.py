"""Fixtures for the policy tests: the embedded SmolLM2, loaded once per session (its path and
tokenizer fixtures, ``smol_path`` and ``smol_tokenizer``, live in ``tests/conftest.py``).

The first run on a machine converts the packaged GGUF file into the user cache (about a minute);
later runs load the cached folder in about a second.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def hf_policy(smol_path):
    from agentgym_lightning.policies.hf import HFPolicy

    # One thread: decoding is memory-bound, and on a shared CPU torch's spinning threads slow
    # each other down (4x measured); it also keeps timings steady.
    policy = HFPolicy(str(smol_path), device="cpu", max_batch_size=8, default_max_tokens=16, num_threads=1)
    yield policy
    policy.close()
