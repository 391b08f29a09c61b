"""A passage index on chromadb's embedded ``PersistentClient``, cached on disk.

::

    index = PassageIndex.open(dataset.corpus, load_embedder())   # builds on first use, then reopens
    hits = index.search(["Who founded Dunmere?"], k=5)[0]       # [Hit(passage, score, rank), ...]

**The cache.** An index lives in ``<cache>/rag-index/<key>/`` (``<cache>``: see
:func:`agentgym_lightning.paths.cache_root`; ``cache_dir=`` overrides ``<cache>/rag-index``).
The key hashes the corpus content (every passage's id, itself a hash of title and text), the
embedding model's fingerprint, the text that is embedded and this module's format version, so
a changed corpus or model gets a new index and an unchanged one is reopened at once, without
embedding anything. The folder holds ``chroma-<id>/`` (chromadb's files: ids and vectors only; the
passages stay in memory) and ``manifest.json``, written last.

**Building** embeds the corpus (a progress bar) into a temporary folder beside the final one and
renames it into place only when complete, so a crash never leaves a half-built index under the
key. **A corrupt or partial index** (no manifest, a manifest that does not match, chromadb
failing to open it, a wrong vector count or a failing probe query) is moved aside, deleted and
rebuilt, with one warning. **Two processes** opening the same index serialise on a file lock
(``<key>.lock``, the ``filelock`` package): the first builds, the others wait and then open
what it built. Querying takes no lock; many processes may query one index at once.

chromadb runs embedded (no server) with telemetry off. The vectors are L2-normalised and the
collection uses cosine distance; :attr:`Hit.score` is the cosine similarity.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agentgym_lightning.paths import cache_root

from .data import Passage
from .embeddings import Embedder

__all__ = ["INDEX_FORMAT", "Hit", "PassageIndex", "IndexCacheWarning", "index_key", "default_index_dir", "embed_text"]

log = logging.getLogger(__name__)

#: Bumped whenever what is stored changes; part of the key.
INDEX_FORMAT = 1
COLLECTION = "passages"
MANIFEST = "manifest.json"
#: Seconds a process waits for another one building the same index before giving up.
LOCK_TIMEOUT_S = 3600.0
_RAG_EXTRA = "pip install 'agentgym-lightning[rag]'"


class IndexCacheWarning(UserWarning):
    """A cached index was unusable and is being rebuilt."""


@dataclass(frozen=True)
class Hit:
    """One search result."""

    passage: Passage
    #: Cosine similarity of the query and the passage (higher is closer).
    score: float
    #: 0 for the best hit.
    rank: int


def embed_text(passage: Passage) -> str:
    """The text embedded for a passage: its title, a newline, its text."""
    return f"{passage.title}\n{passage.text}"


def default_index_dir() -> Path:
    return cache_root() / "rag-index"


def index_key(corpus: Sequence[Passage], embedder: Embedder) -> str:
    """The cache key of ``corpus`` embedded by ``embedder`` (order of passages does not matter)."""
    digest = hashlib.sha256()
    digest.update(json.dumps({"format": INDEX_FORMAT, "model": embedder.fingerprint, "text": "title\\ntext"}).encode())
    for pid in sorted(p.id for p in corpus):
        digest.update(pid.encode())
    return digest.hexdigest()[:24]


def _chromadb() -> Any:
    try:
        import chromadb
    except ImportError:
        raise ImportError(f"retrieval needs chromadb: {_RAG_EXTRA}") from None
    return chromadb


def _client(path: Path) -> Any:
    chromadb = _chromadb()
    from chromadb.config import Settings

    return chromadb.PersistentClient(path=str(path), settings=Settings(anonymized_telemetry=False))


def _close(client: Any) -> None:
    with contextlib.suppress(Exception):
        client.close()


def _forget_failed_client(path: Path) -> None:
    """Drop chromadb's per-path shared ``System`` after a failed open: chromadb registers it
    before starting it and keeps a half-started one forever, which would break the next open
    of the same path in this process."""
    with contextlib.suppress(Exception):
        from chromadb.api.client import SharedSystemClient

        system = SharedSystemClient._identifier_to_system.pop(str(path), None)
        SharedSystemClient._identifier_to_refcount.pop(str(path), None)
        if system is not None:
            with contextlib.suppress(Exception):
                system.stop()


class _Unusable(Exception):
    """The cached index cannot be used (why is the message)."""


class PassageIndex:
    """A searchable corpus. Make one with :meth:`open`; :meth:`close` it when done."""

    def __init__(self, corpus: Sequence[Passage], embedder: Embedder, path: Path, client: Any, collection: Any,
                 *, built: bool) -> None:
        self.corpus = list(corpus)
        self.embedder = embedder
        #: The cache folder of this index.
        self.path = path
        #: Whether :meth:`open` embedded the corpus (False: it reopened the cache).
        self.built = built
        self._by_id = {p.id: p for p in self.corpus}
        self._client = client
        self._collection = collection

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(
        cls,
        corpus: Sequence[Passage],
        embedder: Embedder,
        cache_dir: str | os.PathLike[str] | None = None,
        *,
        progress: bool = True,
        batch_size: int = 64,
    ) -> PassageIndex:
        """The index of ``corpus`` under ``embedder``: reopened from the cache, else built."""
        corpus = list({p.id: p for p in corpus}.values())
        if not corpus:
            raise ValueError("cannot index an empty corpus")
        root = Path(cache_dir).expanduser() if cache_dir is not None else default_index_dir()
        root.mkdir(parents=True, exist_ok=True)
        key = index_key(corpus, embedder)
        final = root / key
        with _file_lock(root / f"{key}.lock"):
            if final.exists():
                try:
                    client, collection = _open_checked(final, key, len(corpus), embedder)
                    return cls(corpus, embedder, final, client, collection, built=False)
                except _Unusable as exc:
                    warnings.warn(f"the retrieval index cache {final} is unusable ({exc}); rebuilding it",
                                  IndexCacheWarning, stacklevel=2)
                    _remove(final)
            _build(final, key, corpus, embedder, progress=progress, batch_size=batch_size)
            try:
                client, collection = _open_checked(final, key, len(corpus), embedder)
            except _Unusable as exc:  # a fresh build that does not open: not a cache problem
                raise RuntimeError(f"a freshly built retrieval index at {final} does not open: {exc}") from None
            return cls(corpus, embedder, final, client, collection, built=True)

    # ------------------------------------------------------------------ searching

    def __len__(self) -> int:
        return len(self.corpus)

    @property
    def closed(self) -> bool:
        return self._collection is None

    def search_vectors(self, vectors: np.ndarray, k: int) -> list[list[Hit]]:
        """The ``k`` best passages for each query vector (rows of ``vectors``)."""
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        if len(vectors) == 0:
            return []
        k = min(k, len(self.corpus))
        result = self._collection.query(query_embeddings=np.asarray(vectors, dtype=np.float32), n_results=k,
                                        include=["distances"])
        hits = []
        for ids, distances in zip(result["ids"], result["distances"]):
            hits.append([Hit(self._by_id[i], 1.0 - float(d), rank) for rank, (i, d) in enumerate(zip(ids, distances))])
        return hits

    def search(self, queries: Sequence[str], k: int = 5) -> list[list[Hit]]:
        """The ``k`` best passages for each query, embedded in one batch."""
        return self.search_vectors(self.embedder.embed(list(queries)), k)

    def close(self) -> None:
        """Release chromadb's files (the index stays cached)."""
        if self._client is not None:
            _close(self._client)
            self._client = self._collection = None

    def __enter__(self) -> PassageIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------- helpers


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    try:
        from filelock import FileLock, Timeout
    except ImportError:
        raise ImportError(f"the retrieval index cache needs filelock: {_RAG_EXTRA}") from None
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=5.0)
    except Timeout:
        log.warning("another process is building the retrieval index (%s); waiting for it", path.with_suffix(""))
        try:
            lock.acquire(timeout=LOCK_TIMEOUT_S)
        except Timeout:
            raise TimeoutError(
                f"waited {LOCK_TIMEOUT_S:.0f} s for the lock {path}; if no process is building the index, delete it"
            ) from None
    try:
        yield
    finally:
        lock.release()


def _read_manifest(folder: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _Unusable("no manifest: an interrupted build") from None
    except (OSError, ValueError) as exc:
        raise _Unusable(f"unreadable manifest: {exc}") from None
    if not isinstance(manifest, dict):
        raise _Unusable("the manifest is not a JSON object")
    return manifest


def _open_checked(folder: Path, key: str, count: int, embedder: Embedder) -> tuple[Any, Any]:
    manifest = _read_manifest(folder)
    if manifest.get("key") != key or manifest.get("count") != count or manifest.get("format") != INDEX_FORMAT:
        raise _Unusable(f"the manifest does not match (key {manifest.get('key')!r}, {manifest.get('count')!r} passages)")
    chroma_dir = manifest.get("chroma_dir")
    if not isinstance(chroma_dir, str) or not chroma_dir.startswith("chroma") or "/" in chroma_dir:
        raise _Unusable("the manifest names no chroma folder")
    # chromadb's vector files are read by C++ code that can crash the process on damaged bytes,
    # so they are checked against the build's checksums before chromadb sees them.
    expected_files = manifest.get("files")
    if not isinstance(expected_files, dict) or not expected_files:
        raise _Unusable("the manifest lists no checksums")
    if _checksums(folder / chroma_dir) != expected_files:
        raise _Unusable("its vector files are missing or changed since the build")
    client = None
    try:
        client = _client(folder / chroma_dir)
        collection = client.get_collection(COLLECTION)
        stored = collection.count()
        if stored != count:
            raise _Unusable(f"it holds {stored} vectors, not {count}")
        # A probe query loads the vector index itself (its files are read lazily) and must find
        # what it found right after the build: a damaged or missing vector file shows here.
        probe = _probe_vector(int(manifest.get("dimension") or 1))
        expected = manifest.get("probe")
        found = collection.query(query_embeddings=probe, n_results=len(expected or [None]), include=["distances"])
        if not isinstance(expected, list) or not found["ids"] or found["ids"][0] != expected:
            raise _Unusable("a probe query no longer finds what it found after the build")
        return client, collection
    except _Unusable:
        if client is not None:
            _close(client)
        raise
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - chromadb's Rust core raises PanicException (a BaseException)
        if client is not None:
            _close(client)
        _forget_failed_client(folder / chroma_dir)
        raise _Unusable(f"chromadb could not open it: {type(exc).__name__}: {str(exc)[:200]}") from None


def _checksums(chroma_dir: Path) -> dict[str, str]:
    """sha256 of chromadb's files except its SQLite database (which chromadb writes to on every
    open; a damaged one makes chromadb raise, which is handled)."""
    out = {}
    if chroma_dir.is_dir():
        for file in sorted(p for p in chroma_dir.rglob("*") if p.is_file()):
            if not file.name.startswith("chroma.sqlite3"):
                out[file.relative_to(chroma_dir).as_posix()] = hashlib.sha256(file.read_bytes()).hexdigest()
    return out


def _probe_vector(dimension: int) -> np.ndarray:
    vector = np.ones((1, dimension), dtype=np.float32)
    vector[0, ::2] = -1.0  # not parallel to any plausible mean direction of the corpus
    return vector / np.linalg.norm(vector)


def _remove(folder: Path) -> None:
    """Move ``folder`` aside (atomic) and delete it."""
    trash = folder.with_name(f".{folder.name}.trash-{uuid.uuid4().hex[:8]}")
    try:
        os.replace(folder, trash)
    except OSError:
        trash = folder
    shutil.rmtree(trash, ignore_errors=True)


def _build(final: Path, key: str, corpus: Sequence[Passage], embedder: Embedder, *, progress: bool,
           batch_size: int) -> None:
    from tqdm.auto import tqdm

    # Similar lengths batched together: less padding, a faster build (the order is not stored).
    corpus = sorted(corpus, key=lambda p: len(embed_text(p)))
    tmp = final.with_name(f".{final.name}.building-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir(parents=True)
    started = time.perf_counter()
    # A fresh folder name per build: chromadb caches state per path for the life of the process.
    chroma_dir = f"chroma-{uuid.uuid4().hex[:8]}"
    try:
        client = _client(tmp / chroma_dir)
        try:
            collection = client.create_collection(COLLECTION, embedding_function=None,
                                                  configuration={"hnsw": {"space": "cosine", "sync_threshold": 2}})
            limit = max(1, int(client.get_max_batch_size()))
            batch_size = max(1, min(batch_size, limit))
            dimension = 0
            ids: list[str] = []
            vectors: list[np.ndarray] = []
            with tqdm(total=len(corpus), desc="embedding passages", unit="passage", disable=not progress,
                      dynamic_ncols=True) as bar:
                for start in range(0, len(corpus), batch_size):
                    part = corpus[start : start + batch_size]
                    embedded = embedder.embed([embed_text(p) for p in part], batch_size=batch_size)
                    dimension = int(embedded.shape[1])
                    ids += [p.id for p in part]
                    vectors.append(embedded)
                    bar.update(len(part))
                    if len(ids) >= limit - batch_size or start + batch_size >= len(corpus):
                        collection.add(ids=ids, embeddings=np.concatenate(vectors))
                        ids, vectors = [], []
            probe = collection.query(query_embeddings=_probe_vector(dimension), n_results=min(10, len(corpus)),
                                     include=["distances"])["ids"][0]
        finally:
            _close(client)
        manifest = {
            "format": INDEX_FORMAT,
            "key": key,
            "count": len(corpus),
            "dimension": dimension,
        "chroma_dir": chroma_dir,
        "probe": probe,
        "files": _checksums(tmp / chroma_dir),
            "model": embedder.name,
            "fingerprint": embedder.fingerprint,
            "build_seconds": round(time.perf_counter() - started, 3),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
