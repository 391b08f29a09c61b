"""Checkpoints: everything a run needs to continue as if it had never stopped.

A checkpoint is a folder ``<output_dir>/checkpoints/checkpoint-<step>`` holding

* ``model.safetensors`` — every weight (full fine-tuning) or ``adapter.safetensors`` — the LoRA
  adapter's weights only (with an adapter per agent, ``lora_per_agent``: every adapter's, each
  key prefixed by ``<adapter name>/``);
* ``optimizer.pt``, ``scheduler.pt`` — their ``state_dict``s;
* ``rng.pt`` — the Python, NumPy and torch (CPU and CUDA) RNG states;
* ``trainer_state.json`` — the step it was taken after, the config, and the metrics history;
* ``manifest.json`` — the step it was taken after, the run (the id in the run folder's ``run_id.json``,
  made by the run's first save), and every other file's size and SHA-256, written last (so
  weights or a manifest moved from another checkpoint, or another run's, do not pass).

It is written to a temporary sibling and renamed into place, so a run killed while saving leaves
the previous checkpoint intact and never a half-written one (so keeping only the newest one, the default,
is safe; the next save removes such a leftover ``.checkpoint-*.tmp-*`` folder); a save that fails (a full disk) removes its temporary
folder and leaves the previous checkpoints as they were; weights that are not finite are never
saved (:class:`NonFiniteWeightsError`), so a NaN step can never prune a good checkpoint away. The
task order needs no saving (it is a function of the seed and the step, see :mod:`agentgym_lightning.rollouts.schedule`).

A checkpoint is verified against its manifest before it is loaded: a file changed since the save
(a truncated or zeroed ``model.safetensors``, a cut ``optimizer.pt``) is refused in one line
(:class:`CorruptCheckpointError`), and resuming a run folder takes its newest *intact* checkpoint,
saying which it passed over (:func:`intact_checkpoint`). A checkpoint written before manifests
existed is loaded unverified; a file of it that cannot be read is refused in one line as well. In a
run whose checkpoints have manifests, one without (deleted) is corrupt, and passed over like one.
Weights that are not finite are refused on load as well (a checkpoint edited with a recomputed
manifest), and ``final/`` is never written from non-finite weights.
How much room a checkpoint takes is known before the first step
(:func:`checkpoint_bytes`, :func:`check_checkpoint_space`); a save that runs out of it raises
``OSError(ENOSPC)`` saying how much it needs.

Everything is loaded with ``torch.load(..., weights_only=True)``: a checkpoint holds tensors and
plain values, never pickled code (the RNG states are stored as tensors and lists for that).

A full fine-tune's ``model.safetensors`` is also a valid Hugging Face weights file, so the run's
``final/`` model (:func:`save_final_model`) hard-links it instead of writing the same weights a
second time.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import random
import re
import shutil
import tempfile
import uuid
import warnings
from dataclasses import dataclass
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentgym_lightning.metrics import json_metrics

__all__ = [
    "TrainerState", "save_checkpoint", "load_checkpoint", "latest_checkpoint", "find_checkpoint", "checkpoint_step", "checkpoints_of", "save_final_model", "CHECKPOINT_DIR",
    "NonFiniteWeightsError", "CheckpointNotSavedWarning", "CorruptCheckpointError", "CorruptCheckpointWarning", "MANIFEST",
    "verify_checkpoint", "intact_checkpoint", "checkpoint_bytes", "check_checkpoint_space", "load_full_weights", "read_weights",
    "weights_file", "read_trainer_state", "saved_config", "non_finite_tensors",
]

CHECKPOINT_DIR = "checkpoints"
_PATTERN = re.compile(r"^checkpoint-(\d+)$")
_TMP_PATTERN = re.compile(r"^\.checkpoint-\d+\.tmp-")
#: Every file's size and SHA-256, written last: a checkpoint is what its manifest says.
MANIFEST = "manifest.json"


class NonFiniteWeightsError(ValueError):
    """The weights to save hold NaN or infinity: saving them would replace a good checkpoint."""


class CheckpointNotSavedWarning(UserWarning):
    """A checkpoint could not be written (a full disk, non-finite weights); the previous one stands."""


class CorruptCheckpointError(ValueError):
    """A checkpoint's files are not what was saved (truncated, overwritten, missing, unreadable)."""


class CorruptCheckpointWarning(UserWarning):
    """A run's newest checkpoint is corrupt: it resumes from an older, intact one."""


@dataclass
class TrainerState:
    """What a checkpoint records besides tensors."""

    step: int
    config: dict[str, Any]
    history: list[dict[str, Any]]
    extra: dict[str, Any]

    def to_json(self) -> str:
        # A skipped update logs NaN (no loss); JSON has no NaN, so non-finite numbers are written as null.
        history = [json_metrics(row) for row in self.history]
        return json.dumps(
            {"step": self.step, "config": self.config, "history": history, "extra": self.extra},
            indent=1,
            default=repr,
            allow_nan=False,
        )


def _trainable_state(model: Any, peft: bool, adapters: Sequence[str] | None = None) -> dict[str, torch.Tensor]:
    if peft:
        from peft import get_peft_model_state_dict

        if adapters:
            return {
                f"{name}/{k}": v.detach().cpu().contiguous()
                for name in adapters
                for k, v in get_peft_model_state_dict(model, adapter_name=name).items()
            }
        return {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(model).items()}
    # Tied weights (embeddings = LM head) appear once.
    seen: dict[int, str] = {}
    out = {}
    for name, tensor in model.state_dict().items():
        key = tensor.data_ptr()
        if key in seen:
            continue
        seen[key] = name
        out[name] = tensor.detach().cpu().contiguous()
    return out


def save_checkpoint(
    output_dir: str | Path,
    *,
    model: Any,
    peft: bool,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    state: TrainerState,
    keep: int | None = None,
    adapters: Sequence[str] | None = None,
) -> Path:
    """Write a checkpoint of ``state.step`` atomically; prune to the newest ``keep``. ``adapters``:
    the LoRA adapters to save (``lora_per_agent``; default: PEFT's one)."""
    from safetensors.torch import save_file

    root = Path(output_dir) / CHECKPOINT_DIR
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.iterdir():  # a run killed mid-save left it: never complete, never needed
        if stale.is_dir() and _TMP_PATTERN.match(stale.name):
            shutil.rmtree(stale, ignore_errors=True)
    weights = _trainable_state(model, peft, adapters)
    if bad := non_finite_tensors(weights):
        raise NonFiniteWeightsError(
            f"the weights of step {state.step} are not finite ({len(bad)} tensors, e.g. {bad[0]}): not saved"
        )
    target = root / f"checkpoint-{state.step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=root))
    try:
        try:
            # format=pt: what transformers writes and expects, so final/ can link this very file.
            save_file(weights, str(tmp / _weights_name(peft)), metadata={"format": "pt"})
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
            torch.save(_rng_state(), tmp / "rng.pt")
            (tmp / "trainer_state.json").write_text(state.to_json(), encoding="utf-8")
            _write_manifest(tmp, state.step, _run_id(root))
        except Exception as exc:
            raise _as_os_error(exc, tmp, weights, optimizer) from exc
        if target.exists():  # the same step saved before (a resumed run re-saving): replace it
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep is not None:
        for old in _checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return target


def non_finite_tensors(weights: dict[str, torch.Tensor]) -> list[str]:
    """The names of the floating-point tensors holding NaN or infinity."""
    return [name for name, tensor in weights.items() if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())]


def _weights_name(peft: bool) -> str:
    return "adapter.safetensors" if peft else "model.safetensors"


def weights_file(peft: bool) -> str:
    """The name of a checkpoint's weights file: the LoRA adapter's (``peft``) or every weight's."""
    return _weights_name(peft)


def _as_os_error(exc: Exception, folder: Path, weights: dict[str, torch.Tensor], optimizer: Any) -> Exception:
    """A failed write as an ``OSError`` (safetensors reports a full disk as its own error type);
    a full disk's message says how much room a checkpoint needs. Anything else is returned as is."""
    code = exc.errno if isinstance(exc, OSError) else None
    if code is None and type(exc).__name__ == "SafetensorError" and (m := re.search(r"os error (\d+)", str(exc))):
        code = int(m.group(1))
    if code is None:
        return exc
    if code in (errno.ENOSPC, errno.EDQUOT):
        needed = _tensor_bytes(weights.values()) + _optimizer_bytes(optimizer)
        free = shutil.disk_usage(folder.parent).free
        why = f"{os.strerror(code)} (a checkpoint of this run needs about {_mb(needed)}; {_mb(free)} free)"
        return OSError(code, why, getattr(exc, "filename", None) or str(folder))
    return OSError(code, os.strerror(code), getattr(exc, "filename", None) or str(folder))


def _mb(n: float) -> str:
    return f"{n / 2**20:,.0f} MB" if n >= 2**20 else f"{n / 1024:,.0f} KB"


def _tensor_bytes(tensors: Any) -> int:
    return int(sum(t.numel() * t.element_size() for t in tensors))


def _optimizer_bytes(optimizer: Any) -> int:
    """The optimizer state's size: what it holds now, or before its first step, what it will
    (AdamW: two moments per trained weight; Adafactor: a row and a column per matrix)."""
    held = _tensor_bytes(t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor))
    if held:
        return held
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    if type(optimizer).__name__ == "Adafactor":
        return int(sum((sum(p.shape[-2:]) if p.dim() >= 2 else p.numel()) * 4 for p in params))
    return 2 * _tensor_bytes(params)


def checkpoint_bytes(model: Any, peft: bool, optimizer: Any, adapters: Sequence[str] | None = None) -> int:
    """About how many bytes one checkpoint of this model and optimizer takes on disk (the trained
    weights, the optimizer's state; the rest is small)."""
    return _tensor_bytes(_trainable_state(model, peft, adapters).values()) + _optimizer_bytes(optimizer) + 2**20


def check_checkpoint_space(output_dir: str | Path, needed: int) -> None:
    """Raise ``OSError(ENOSPC)`` when ``output_dir`` has less free room than ``needed`` bytes (the
    run would train and lose every step it cannot checkpoint). A save writes the new checkpoint
    before it removes the old one, so a run keeping one needs room for two."""
    folder = Path(output_dir)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise OSError(
            errno.ENOSPC,
            f"{output_dir} has {_mb(free)} free and a checkpoint of this run needs about {_mb(needed)}: "
            "free some space or choose another --output-dir",
            str(output_dir),
        )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


#: In a run folder (beside ``checkpoints/``): the run's id, which every manifest of the run names.
RUN_FILE = "run_id.json"


def _run_id(root: Path) -> str:
    """The id of the run whose checkpoints ``root`` (its ``checkpoints/``) holds, made (and
    written) by its first save."""
    known = _folder_run(root)
    if known is not None:
        return known
    run = uuid.uuid4().hex
    tmp = root.parent / f".{RUN_FILE}.tmp"
    tmp.write_text(json.dumps({"run": run}), encoding="utf-8")
    os.replace(tmp, root.parent / RUN_FILE)
    return run


def _folder_run(root: Path) -> str | None:
    """The run id of the run folder whose ``checkpoints/`` is ``root``, or ``None`` (none, or unreadable)."""
    try:
        run = json.loads((root.parent / RUN_FILE).read_text(encoding="utf-8")).get("run")
    except (OSError, ValueError, AttributeError):
        return None
    return run if isinstance(run, str) else None


def _write_manifest(folder: Path, step: int, run: str | None = None) -> None:
    files = {p.name: {"size": p.stat().st_size, "sha256": _sha256(p)} for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST}
    with open(folder / MANIFEST, "w", encoding="utf-8") as fh:
        # The step and the run bind the manifest (and so every file it hashes) to its
        # checkpoint-<step> folder in this run's checkpoints/.
        json.dump({"step": step, "run": run, "files": files}, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())


#: Files verified already, by (path, size, mtime): a resume verifies the checkpoint it picks and
#: then loads it, and the weights of a large model need hashing once.
_verified: set[tuple[str, int, int]] = set()


def verify_checkpoint(checkpoint: str | Path, *, require_manifest: bool = False) -> None:
    """Raise :class:`CorruptCheckpointError` (one line: which file, what is wrong) unless every
    file of the checkpoint's manifest is there with its size and hash, and the manifest is of
    this folder's step. A checkpoint saved before manifests existed passes (nothing to check
    against) unless ``require_manifest`` (its run's other checkpoints have one: it was deleted)."""
    checkpoint = Path(checkpoint)
    manifest = checkpoint / MANIFEST
    if not manifest.is_file():
        if not (checkpoint / "trainer_state.json").is_file():
            raise CorruptCheckpointError(f"{checkpoint} is not a checkpoint: it has no {MANIFEST} and no trainer_state.json")
        if require_manifest:
            raise CorruptCheckpointError(f"{checkpoint} is corrupt: its {MANIFEST} is missing (the run's other checkpoints have one)")
        return
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
        files, saved_step, saved_run = data["files"], data.get("step"), data.get("run")
        entries = [(str(name), int(entry["size"]), str(entry["sha256"])) for name, entry in files.items()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise CorruptCheckpointError(f"{checkpoint} is corrupt: its {MANIFEST} cannot be read ({type(exc).__name__})") from None
    folder_step = _PATTERN.match(checkpoint.name)
    if saved_step is not None and folder_step is not None and saved_step != int(folder_step.group(1)):
        raise CorruptCheckpointError(f"{checkpoint} is corrupt: its {MANIFEST} is the one of step {saved_step!r}")
    run = _folder_run(checkpoint.parent)
    if saved_run is not None and run is not None and saved_run != run:
        raise CorruptCheckpointError(
            f"{checkpoint} is another run's checkpoint: its {MANIFEST} names run {str(saved_run)[:40]!r}, "
            f"this folder's {RUN_FILE} {run!r}"
        )
    for name, size, sha in entries:
        path = checkpoint / name
        if path.name != name or not path.is_file():
            raise CorruptCheckpointError(f"{checkpoint} is corrupt: {name} is missing")
        stat = path.stat()
        if stat.st_size != size:
            raise CorruptCheckpointError(f"{checkpoint} is corrupt: {name} has {stat.st_size} bytes, {size} were saved")
        key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
        if key in _verified:
            continue
        if _sha256(path) != sha:
            raise CorruptCheckpointError(f"{checkpoint} is corrupt: {name} is not the file that was saved (its SHA-256 differs)")
        _verified.add(key)


def save_final_model(
    folder: str | Path, *, model: Any, tokenizer: Any, peft: bool, checkpoint: Path | None = None, adapters: Sequence[str] | None = None
) -> Path:
    """Write the trained model (or LoRA adapter) and its tokenizer to ``folder``, loadable with
    ``from_pretrained``.

    ``checkpoint``: a checkpoint of these very weights (the run's last one). A full fine-tune's
    weights are then hard-linked from it (copied where the file system has no hard links) rather
    than written again: for a 135M model in fp32 that is 540 MB less on disk. Without it, or for
    an adapter (small, and PEFT's own file layout), ``save_pretrained`` writes them. ``adapters``
    (``lora_per_agent``): each goes to ``folder/adapters/<name>/``, loadable on its own with
    ``PeftModel.from_pretrained(base, folder / "adapters" / name)``. Raises
    :class:`NonFiniteWeightsError`, writing nothing, when the weights hold NaN or infinity.
    """
    folder = Path(folder)
    if bad := non_finite_tensors(_trainable_state(model, peft, adapters)):
        raise NonFiniteWeightsError(f"the final weights are not finite ({len(bad)} tensors, e.g. {bad[0]}): {folder} not written")
    if adapters:
        model.save_pretrained(folder / "adapters", selected_adapters=list(adapters))
    elif peft or checkpoint is None:
        model.save_pretrained(folder)
    else:
        folder.mkdir(parents=True, exist_ok=True)
        model.config.save_pretrained(folder)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(folder)
        source, target = checkpoint / _weights_name(peft), folder / _weights_name(peft)
        tmp = folder / f".{target.name}.tmp"
        tmp.unlink(missing_ok=True)
        try:
            os.link(source, tmp)
        except OSError:  # no hard links here (another device, a file system without them)
            shutil.copyfile(source, tmp)
        os.replace(tmp, target)  # a final/ from an earlier run is replaced, never written through
    tokenizer.save_pretrained(folder)
    return folder


def _checkpoints(root: Path) -> list[Path]:
    found = [p for p in root.iterdir() if p.is_dir() and _PATTERN.match(p.name)] if root.is_dir() else []
    return sorted(found, key=checkpoint_step)


def checkpoint_step(checkpoint: Path) -> int:
    """The step of a checkpoint folder, from its name (``checkpoint-000005``: 5)."""
    match = _PATTERN.match(checkpoint.name)
    if match is None:
        raise ValueError(f"{checkpoint} is not a checkpoint folder (checkpoint-<step>)")
    return int(match.group(1))


def checkpoints_of(output_dir: str | Path) -> list[Path]:
    """A run folder's checkpoint folders, oldest first (intact or not)."""
    return _checkpoints(Path(output_dir) / CHECKPOINT_DIR)


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run folder, or ``None``."""
    found = _checkpoints(Path(output_dir) / CHECKPOINT_DIR)
    return found[-1] if found else None


def _is_checkpoint(path: Path) -> bool:
    return (path / "trainer_state.json").is_file() or (path / MANIFEST).is_file()


def intact_checkpoint(path: str | Path) -> tuple[Path, list[str]]:
    """The checkpoint to resume from, verified, and why each newer one was passed over.

    ``path`` is one checkpoint folder (refused with :class:`CorruptCheckpointError` when it is
    corrupt) or a run folder, whose newest intact checkpoint is taken."""
    path = Path(path)
    if _is_checkpoint(path):
        verify_checkpoint(path)
        return path, []
    found = _checkpoints(path / CHECKPOINT_DIR)
    if not found:
        raise FileNotFoundError(
            f"no checkpoint in {path}: pass a run's output folder (with {CHECKPOINT_DIR}/checkpoint-N inside) "
            "or one checkpoint folder"
        )
    skipped = []
    # A run that writes manifests writes one for every checkpoint: a missing one was deleted.
    require_manifest = any((c / MANIFEST).is_file() for c in found)
    for checkpoint in reversed(found):
        try:
            verify_checkpoint(checkpoint, require_manifest=require_manifest)
        except CorruptCheckpointError as exc:
            skipped.append(str(exc))
            continue
        return checkpoint, skipped
    raise CorruptCheckpointError(f"every checkpoint in {path / CHECKPOINT_DIR} is corrupt; the newest: {skipped[0]}")


def find_checkpoint(path: str | Path) -> Path:
    """``path`` is a checkpoint folder, or a run folder whose newest intact checkpoint is taken
    (a :class:`CorruptCheckpointWarning` names each newer one passed over). Raises
    :class:`CorruptCheckpointError` for a corrupt checkpoint folder, or a run with no intact one."""
    checkpoint, skipped = intact_checkpoint(path)
    for reason in skipped:
        warnings.warn(f"{reason}; resuming from {checkpoint.name}", CorruptCheckpointWarning, stacklevel=2)
    return checkpoint


def read_trainer_state(checkpoint: str | Path) -> dict[str, Any]:
    """A checkpoint's ``trainer_state.json`` (:class:`TrainerState`'s fields), read; raises
    :class:`CorruptCheckpointError` when it is missing or not a JSON object."""
    checkpoint = Path(checkpoint)
    try:
        data = json.loads((checkpoint / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise CorruptCheckpointError(f"{checkpoint} is corrupt: trainer_state.json cannot be read ({type(exc).__name__})") from None
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
        raise CorruptCheckpointError(f"{checkpoint} is corrupt: trainer_state.json holds no config")
    return data


def saved_config(checkpoint: str | Path, fields: Sequence[str] | None = None) -> dict[str, Any]:
    """The config a checkpoint was saved with (its ``trainer_state.json``), as a dict; with
    ``fields`` (a config class's ``field_names()``), only those keys: a field an older or newer
    version wrote and this one does not know is left out."""
    config = read_trainer_state(checkpoint)["config"]
    return config if fields is None else {k: v for k, v in config.items() if k in fields}


def load_checkpoint(
    checkpoint: str | Path, *, model: Any, peft: bool, optimizer: torch.optim.Optimizer, scheduler: Any,
    adapters: Sequence[str] | None = None,
) -> TrainerState:
    """Restore weights, optimizer, scheduler and RNG states in place; returns the saved state.
    ``adapters``: the LoRA adapters saved (``lora_per_agent``), each restored to its own."""
    checkpoint = Path(checkpoint)
    verify_checkpoint(checkpoint)
    data = read_trainer_state(checkpoint)
    if peft:
        from peft import set_peft_model_state_dict

        weights = checkpoint / _weights_name(peft)
        if not weights.is_file():
            raise ValueError(f"{checkpoint} holds full weights, not a LoRA adapter: resume without use_peft, or from a LoRA run")
        saved = _finite_weights(weights)
        if adapters:
            for name in adapters:
                own = {k[len(name) + 1 :]: v for k, v in saved.items() if k.startswith(f"{name}/")}
                if not own:
                    raise ValueError(f"{checkpoint} holds no weights of the adapter {name!r}: resume with the run's own lora_per_agent")
                set_peft_model_state_dict(model, own, adapter_name=name)
        else:
            set_peft_model_state_dict(model, saved)
    else:
        weights = checkpoint / _weights_name(peft)
        if not weights.is_file():
            raise ValueError(f"{checkpoint} holds a LoRA adapter, not full weights: resume with use_peft")
        load_full_weights(model, _finite_weights(weights), checkpoint)
    optimizer.load_state_dict(_load(checkpoint / "optimizer.pt"))
    scheduler.load_state_dict(_load(checkpoint / "scheduler.pt"))
    _set_rng_state(_load(checkpoint / "rng.pt"))
    return TrainerState(step=int(data["step"]), config=data["config"], history=data.get("history", []), extra=data.get("extra", {}))


def load_full_weights(model: Any, weights: dict[str, torch.Tensor], where: str | Path) -> None:
    """Load a full fine-tune's saved ``weights`` (tied weights saved once) into ``model``, in
    place; ``ValueError`` naming ``where`` when they are another model's."""
    missing, unexpected = model.load_state_dict(weights, strict=False)
    # Tied weights were saved once; anything else missing means a different model.
    tied = {n for n in missing if n.endswith("lm_head.weight") and getattr(model.config, "tie_word_embeddings", False)}
    if set(missing) - tied or unexpected:
        raise ValueError(f"{where} does not fit this model: missing {sorted(set(missing) - tied)[:5]}, unexpected {unexpected[:5]}")


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` file (:class:`CorruptCheckpointError` when it cannot be read)."""
    return _load_weights(Path(path))


def _rng_state() -> dict[str, Any]:
    """Python, NumPy and torch RNG states as tensors, lists and numbers (``weights_only`` loads them)."""
    version, internal, gauss = random.getstate()
    numpy = np.random.get_state(legacy=False)
    rng: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": {
            "bit_generator": numpy["bit_generator"],
            "key": torch.from_numpy(numpy["state"]["key"].astype(np.int64)),
            "pos": int(numpy["state"]["pos"]),
            "has_gauss": int(numpy["has_gauss"]),
            "gauss": float(numpy["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def _set_rng_state(rng: dict[str, Any]) -> None:
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy = rng["numpy"]
    if isinstance(numpy, tuple):  # an older checkpoint: NumPy's legacy state tuple
        np.random.set_state(numpy)
    else:
        np.random.set_state({
        "bit_generator": numpy["bit_generator"],
            "state": {"key": numpy["key"].numpy().astype(np.uint32), "pos": numpy["pos"]},
            "has_gauss": numpy["has_gauss"],
            "gauss": numpy["gauss"],
        })
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


#: What checkpoints saved before the RNG states were plain data hold in rng.pt (NumPy's legacy
#: state: an array of uint32): data constructors only, the allowlist torch documents for them.
_NUMPY_ARRAY_GLOBALS = [np._core.multiarray._reconstruct, np.ndarray, np.dtype, np.dtypes.UInt32DType]


def _finite_weights(path: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's weights, refused when any is not finite: a model resumed from them would
    fail every later episode ("probability tensor contains nan") and write them to ``final/``."""
    weights = _load_weights(path)
    if bad := non_finite_tensors(weights):
        raise CorruptCheckpointError(
            f"{path.parent} is corrupt: {path.name} holds non-finite weights ({len(bad)} tensors, e.g. {bad[0]}); "
            "resume from an earlier checkpoint"
        )
    return weights


def _load_weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except Exception as exc:  # noqa: BLE001 - safetensors' own error type: a file it cannot read
        raise CorruptCheckpointError(f"{path.parent} is corrupt: {path.name} cannot be read ({_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def _load(path: Path) -> Any:
    try:
        with torch.serialization.safe_globals(_NUMPY_ARRAY_GLOBALS):
            return torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise CorruptCheckpointError(f"{path.parent} is corrupt: {path.name} is missing") from None
    except pickle.UnpicklingError as exc:
        reason = next((line.strip() for line in str(exc).splitlines() if "GLOBAL" in line), "")
        raise ValueError(
            f"{path} holds pickled Python objects, which are not loaded (they could run code): {reason}; "
            "resume from a checkpoint saved by agentgym-lightning"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:  # a cut or overwritten file
        raise CorruptCheckpointError(f"{path.parent} is corrupt: {path.name} cannot be read ({_first_line(exc)})") from None
