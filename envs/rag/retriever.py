"""The search tool of the RAG envs: one shared index per corpus, concurrent searches batched.

Every env of a rollout searches the same corpus, so :func:`get_retriever` hands all of them one
:class:`Retriever` (one index, one embedding model) per process. Episodes search from their own
threads at once; :meth:`Retriever.search` combines the searches that are waiting into one batch
(one embedding call, one chromadb query) instead of running them one by one: one waiting
caller embeds everything queued, the others sleep until their results are there. Under
concurrency the serving caller first lingers a few milliseconds while the queue still grows
(callers woken by the previous batch submit their next search). No background thread is
involved, and a lone search never waits.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
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
    finished: bool = False
    #: This request's caller serves the queue (set by the previous server when it hands over).
    lead: bool = False
    wake: threading.Event = field(default_factory=threading.Event)


class Retriever:
    """``search(query, k) -> hits`` over a :class:`PassageIndex`, thread-safe, batched.

    One caller at a time serves the queue: it embeds and searches every queued search in one
    batch, until its own is done, then hands the role to the caller of the oldest search still
    queued. The others sleep on their own event, so nobody spins and a lone search is served at
    once by its own caller.
    """

    def __init__(self, index: PassageIndex, max_batch: int = 256, linger_s: float = 0.01) -> None:
        self.index = index
        self.max_batch = max_batch
        #: Under concurrency (the last batch served several searches) the server first waits up
        #: to this long, while the queue still grows, for searches of callers just woken by the
        #: previous batch. A lone searcher never waits.
        self.linger_s = linger_s
        self._queue: list[_Request] = []
        self._lock = threading.Lock()
        self._serving = False
        self._last_batch = 1
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
        with self._lock:
            self._queue.append(request)
            if not self._serving:
                self._serving = request.lead = True
        if not request.lead:
            request.wake.wait()  # served by someone else, or handed the serving role
        if request.lead:
            try:
                while not request.finished:
                    self._linger()
                    with self._lock:
                        batch, self._queue = self._take(self._queue)
                    self._serve(batch)
            finally:
                with self._lock:
                    if self._queue:
                        successor = self._queue[0]
                        successor.lead = True
                        successor.wake.set()
                    else:
                        self._serving = False
        if request.error is not None:
            raise request.error
        assert request.hits is not None
        return request.hits

    async def asearch(self, query: str, k: int = 5) -> list[Hit]:
        """``search`` for ``async`` agents (runs in a worker thread; batches with the others)."""
        return await asyncio.to_thread(self.search, query, k)

    def _linger(self) -> None:
        if self._last_batch <= 1 or self.linger_s <= 0:
            return
        deadline = time.monotonic() + self.linger_s
        size = len(self._queue)
        while time.monotonic() < deadline and size < self.max_batch:
            time.sleep(self.linger_s / 5)
            now = len(self._queue)
            if now == size:  # nobody else is coming
                break
            size = now

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
                r.error, r.finished = exc, True
                r.wake.set()
            if not isinstance(exc, Exception):
                raise
            return
        self.queries += len(texts)
        self.batches += 1
        self._last_batch = len(batch)
        start = 0
        for r in batch:
            r.hits = [h[: r.k] for h in hits[start : start + len(r.queries)]]
            r.finished = True
            start += len(r.queries)
            r.wake.set()

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
