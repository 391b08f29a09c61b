"""The search tool of the RAG envs: one shared index per corpus, concurrent searches batched.

Every env of a rollout searches the same corpus, so :func:`get_retriever` hands all of them one
:class:`Retriever` (one index, one embedding model) per process. Episodes search from their own
threads at once; :meth:`Retriever.search` combines the searches that are waiting into one batch
(one embedding call, one chromadb query) instead of running them one by one: the first waiting
caller embeds everything queued, the others find their results done. No background thread is
involved and a lone search costs the same as before.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .data import Passage
from .embeddings import Embedder, load_embedder
from .index import Hit, PassageIndex

__all__ = ["Retriever", "get_retriever", "close_retrievers"]


@dataclass
class _Request:
    queries: list[str]
    k: int
    hits: list[list[Hit]] | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


class Retriever:
    """``search(query, k) -> hits`` over a :class:`PassageIndex`, thread-safe, batched."""

    def __init__(self, index: PassageIndex, max_batch: int = 256) -> None:
        self.index = index
        self.max_batch = max_batch
        self._queue: list[_Request] = []
        self._queue_lock = threading.Lock()
        self._work_lock = threading.Lock()
        #: Searches served, and the embedding batches that served them (batching statistics).
        self.queries = 0
        self.batches = 0

    def search(self, query: str, k: int = 5) -> list[Hit]:
        """The ``k`` passages closest to ``query``, best first."""
        return self.search_many([query], k)[0]

    def search_many(self, queries: Sequence[str], k: int = 5) -> list[list[Hit]]:
        """Several searches at once (one result list per query)."""
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        request = _Request(list(queries), k)
        if not request.queries:
            return []
        with self._queue_lock:
            self._queue.append(request)
        while not request.done.is_set():
            with self._work_lock:
                if request.done.is_set():  # a caller before us served it
                    break
                with self._queue_lock:
                    batch, self._queue = self._take(self._queue)
                self._serve(batch)
        if request.error is not None:
            raise request.error
        assert request.hits is not None
        return request.hits

    async def asearch(self, query: str, k: int = 5) -> list[Hit]:
        """``search`` for ``async`` agents (runs in a worker thread; batches with the others)."""
        return await asyncio.to_thread(self.search, query, k)

    def _take(self, queue: list[_Request]) -> tuple[list[_Request], list[_Request]]:
        batch, size = [], 0
        for i, request in enumerate(queue):
            if batch and size + len(request.queries) > self.max_batch:
                return batch, queue[i:]
            batch.append(request)
            size += len(request.queries)
        return batch, []

    def _serve(self, batch: list[_Request]) -> None:
        texts = [q for r in batch for q in r.queries]
        try:
            vectors = self.index.embedder.embed(texts)
            hits = self.index.search_vectors(vectors, max(r.k for r in batch))
        except BaseException as exc:  # noqa: BLE001 - handed to every caller of the batch
            for r in batch:
                r.error = exc
                r.done.set()
            if not isinstance(exc, Exception):
                raise
            return
        self.queries += len(texts)
        self.batches += 1
        start = 0
        for r in batch:
            r.hits = [h[: r.k] for h in hits[start : start + len(r.queries)]]
            start += len(r.queries)
            r.done.set()

    def close(self) -> None:
        self.index.close()

    def __deepcopy__(self, memo: dict[int, object]) -> Retriever:
        return self  # shared, like the index it searches (gym.make deep-copies env kwargs)


_retrievers: dict[tuple[str, str], Retriever] = {}
_retrievers_lock = threading.Lock()


def get_retriever(
    corpus: Sequence[Passage],
    embedding_model: str | Embedder | None = None,
    index_dir: str | os.PathLike[str] | None = None,
    *,
    device: str = "cpu",
    progress: bool = True,
) -> Retriever:
    """The process-wide retriever of ``corpus`` (its index opened, or built on first use)."""
    embedder = load_embedder(embedding_model, device=device)
    from .index import default_index_dir, index_key

    root = Path(index_dir).expanduser() if index_dir is not None else default_index_dir()
    key = (str(root.resolve()), index_key(corpus, embedder))
    with _retrievers_lock:
        found = _retrievers.get(key)
        if found is None or found.index.closed:
            found = _retrievers[key] = Retriever(PassageIndex.open(corpus, embedder, root, progress=progress))
        return found


def close_retrievers() -> None:
    """Close every shared retriever (tests; freeing chromadb's files)."""
    with _retrievers_lock:
        for r in _retrievers.values():
            r.close()
        _retrievers.clear()
