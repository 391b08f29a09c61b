"""The chromadb passage index: build once, reopen without embedding, survive a damaged cache and
two processes opening it at once. Index mechanics use a tiny hashing embedder; the real model is
tested in test_retrieval.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("chromadb", reason="needs the [rag] extra")

from agentgym_lightning.envs.rag.data import Passage, load_musique  # noqa: E402
from agentgym_lightning.envs.rag.index import IndexCacheWarning, PassageIndex, index_key  # noqa: E402

from .conftest import HASH_EMBEDDER_SOURCE, HashEmbedder  # noqa: E402


@pytest.fixture(scope="module")
def corpus(musique_dir: Path) -> list[Passage]:
    """A 150-passage slice of the MuSiQue corpus."""
    return load_musique(data_dir=musique_dir).corpus[:150]


def test_build_then_reopen_embeds_nothing(corpus, tmp_path: Path):
    embedder = HashEmbedder()
    with PassageIndex.open(corpus, embedder, tmp_path, progress=False) as index:
        assert index.built and embedder.embedded == len(corpus) and len(index) == len(corpus)
        hits = index.search([corpus[7].title + " " + corpus[7].text], k=3)[0]
        assert hits[0].passage == corpus[7] and hits[0].score == pytest.approx(1.0, abs=1e-4)
        assert [h.rank for h in hits] == [0, 1, 2] and hits[0].score >= hits[1].score >= hits[2].score
        path = index.path
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["count"] == len(corpus) and manifest["model"] == "hash-bow"
    embedder.embedded = 0
    with PassageIndex.open(list(reversed(corpus)), embedder, tmp_path, progress=False) as again:
        assert not again.built and again.path == path  # passage order does not change the key
        assert embedder.embedded == 0
        assert again.search([corpus[7].text], k=1)[0][0].passage == corpus[7]
        assert embedder.embedded == 1  # only the query


def test_key_follows_corpus_content_and_model(corpus):
    a = HashEmbedder()
    b = HashEmbedder()
    b.fingerprint = "another-model"
    edited = [Passage.make(corpus[0].title, corpus[0].text + " Edited.")] + corpus[1:]
    assert index_key(corpus, a) == index_key(list(corpus), HashEmbedder())
    assert index_key(corpus, a) != index_key(corpus, b)
    assert index_key(corpus, a) != index_key(edited, a)
    assert index_key(corpus, a) != index_key(corpus[:-1], a)


def _chroma_files(path: Path) -> Path:
    return path / json.loads((path / "manifest.json").read_text())["chroma_dir"]


def _segment(path: Path) -> Path:
    return next(p for p in _chroma_files(path).iterdir() if p.is_dir())


DAMAGE = {
    "no manifest (an interrupted build)": lambda p: (p / "manifest.json").unlink(),
    "unreadable manifest": lambda p: (p / "manifest.json").write_text("{"),
    "garbage database": lambda p: (_chroma_files(p) / "chroma.sqlite3").write_bytes(b"not a database" * 500),
    "truncated database": lambda p: os.truncate(_chroma_files(p) / "chroma.sqlite3", 4096),
    "flipped vector bytes": lambda p: (_segment(p) / "data_level0.bin").write_bytes(
        bytes((b + 13) % 256 if i % 97 == 0 else b for i, b in enumerate((_segment(p) / "data_level0.bin").read_bytes()))),
    "truncated vector file": lambda p: os.truncate(_segment(p) / "data_level0.bin", 100),
    "vector folder deleted": lambda p: shutil.rmtree(_segment(p)),
    "emptied folder": lambda p: [shutil.rmtree(c) if c.is_dir() else c.unlink() for c in list(p.iterdir())],
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_cache_is_rebuilt_not_fatal(corpus, tmp_path: Path, damage: str):
    embedder = HashEmbedder()
    with PassageIndex.open(corpus, embedder, tmp_path, progress=False) as index:
        path = index.path
        expected = [h.passage.id for h in index.search([corpus[3].text], k=5)[0]]
    DAMAGE[damage](path)
    embedder.embedded = 0
    with pytest.warns(IndexCacheWarning, match="unusable"):
        rebuilt = PassageIndex.open(corpus, embedder, tmp_path, progress=False)
    with rebuilt:
        assert rebuilt.built and embedder.embedded == len(corpus)
        assert [h.passage.id for h in rebuilt.search([corpus[3].text], k=5)[0]] == expected
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == [path.name]  # no debris


def test_two_processes_opening_at_once_build_once_and_both_search(corpus, tmp_path: Path, musique_dir: Path):
    script = HASH_EMBEDDER_SOURCE + textwrap.dedent(f"""
        import json, sys
        from agentgym_lightning.envs.rag.data import load_musique
        from agentgym_lightning.envs.rag.index import PassageIndex
        corpus = load_musique(data_dir={str(musique_dir)!r}).corpus[:150]
        embedder = HashEmbedder()
        with PassageIndex.open(corpus, embedder, {str(tmp_path)!r}, progress=False) as index:
            hits = index.search([corpus[11].text], k=3)[0]
            print(json.dumps({{"built": index.built, "embedded": embedder.embedded, "top": hits[0].passage.id}}))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-2000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(o["built"] for o in outs) == [False, True]  # one built, the other waited and reopened
    assert sorted(o["embedded"] for o in outs) == [1, len(corpus) + 1]
    assert outs[0]["top"] == outs[1]["top"] == corpus[11].id
    embedder = HashEmbedder()
    with PassageIndex.open(corpus, embedder, tmp_path, progress=False) as index:
        assert not index.built and embedder.embedded == 0


def test_empty_corpus_and_bad_k_are_errors(tmp_path: Path, corpus):
    with pytest.raises(ValueError, match="empty corpus"):
        PassageIndex.open([], HashEmbedder(), tmp_path)
    with PassageIndex.open(corpus[:5], HashEmbedder(), tmp_path, progress=False) as index:
        with pytest.raises(ValueError, match="k must be"):
            index.search(["x"], k=0)
        assert len(index.search(["x"], k=50)[0]) == 5  # k is capped at the corpus size
