"""Checkpoints: everything a run needs to continue as if it had never stopped.

A checkpoint is a folder ``<output_dir>/checkpoints/checkpoint-<step>`` holding

* ``model.safetensors`` — every weight (full fine-tuning) or ``adapter.safetensors`` — the LoRA
  adapter's weights only (with an adapter per agent, ``lora_per_agent``: every adapter's, each
  key prefixed by ``<adapter name>/``);
* ``optimizer.pt``, ``scheduler.pt`` — their ``state_dict``s;
* ``rng.pt`` — the Python, NumPy and torch (CPU and CUDA) RNG states;
* ``trainer_state.json`` — the step it was taken after, the config, and the metrics history.

It is written to a temporary sibling and renamed into place, so a run killed while saving leaves
the previous checkpoint intact and never a half-written one (so keeping only the newest one, the default,
is safe; the next save removes such a leftover ``.checkpoint-*.tmp-*`` folder); a save that fails (a full disk) removes its temporary
folder and leaves the previous checkpoints as they were; weights that are not finite are never
saved (:class:`NonFiniteWeightsError`), so a NaN step can never prune a good checkpoint away. The
task order needs no saving (it is a function of the seed and the step, see :mod:`.schedule`).

Everything is loaded with ``torch.load(..., weights_only=True)``: a checkpoint holds tensors and
plain values, never pickled code (the RNG states are stored as tensors and lists for that).

A full fine-tune's ``model.safetensors`` is also a valid Hugging Face weights file, so the run's
``final/`` model (:func:`save_final_model`) hard-links it instead of writing the same weights a
second time.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
import tempfile
from dataclasses import dataclass
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentgym_lightning.metrics import json_metrics

__all__ = [
    "TrainerState", "save_checkpoint", "load_checkpoint", "latest_checkpoint", "find_checkpoint", "save_final_model", "CHECKPOINT_DIR",
    "NonFiniteWeightsError", "CheckpointNotSavedWarning",
]

CHECKPOINT_DIR = "checkpoints"
_PATTERN = re.compile(r"^checkpoint-(\d+)$")
_TMP_PATTERN = re.compile(r"^\.checkpoint-\d+\.tmp-")


class NonFiniteWeightsError(ValueError):
    """The weights to save hold NaN or infinity: saving them would replace a good checkpoint."""


class CheckpointNotSavedWarning(UserWarning):
    """A checkpoint could not be written (a full disk, non-finite weights); the previous one stands."""


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
    bad = [name for name, tensor in weights.items() if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())]
    if bad:
        raise NonFiniteWeightsError(
            f"the weights of step {state.step} are not finite ({len(bad)} tensors, e.g. {bad[0]}): not saved"
        )
    target = root / f"checkpoint-{state.step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=root))
    try:
        # format=pt: what transformers writes and expects, so final/ can link this very file.
        save_file(weights, str(tmp / _weights_name(peft)), metadata={"format": "pt"})
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        torch.save(_rng_state(), tmp / "rng.pt")
        (tmp / "trainer_state.json").write_text(state.to_json(), encoding="utf-8")
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


def _weights_name(peft: bool) -> str:
    return "adapter.safetensors" if peft else "model.safetensors"


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
    ``PeftModel.from_pretrained(base, folder / "adapters" / name)``.
    """
    folder = Path(folder)
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
    return sorted(found, key=lambda p: int(_PATTERN.match(p.name).group(1)))  # type: ignore[union-attr]


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run folder, or ``None``."""
    found = _checkpoints(Path(output_dir) / CHECKPOINT_DIR)
    return found[-1] if found else None


def find_checkpoint(path: str | Path) -> Path:
    """``path`` is a checkpoint folder, or a run folder whose newest checkpoint is taken."""
    path = Path(path)
    if (path / "trainer_state.json").is_file():
        return path
    latest = latest_checkpoint(path)
    if latest is None:
        raise FileNotFoundError(
            f"no checkpoint in {path}: pass a run's output folder (with {CHECKPOINT_DIR}/checkpoint-N inside) "
            "or one checkpoint folder"
        )
    return latest


def load_checkpoint(
    checkpoint: str | Path, *, model: Any, peft: bool, optimizer: torch.optim.Optimizer, scheduler: Any,
    adapters: Sequence[str] | None = None,
) -> TrainerState:
    """Restore weights, optimizer, scheduler and RNG states in place; returns the saved state.
    ``adapters``: the LoRA adapters saved (``lora_per_agent``), each restored to its own."""
    from safetensors.torch import load_file

    checkpoint = Path(checkpoint)
    data = json.loads((checkpoint / "trainer_state.json").read_text(encoding="utf-8"))
    if peft:
        from peft import set_peft_model_state_dict

        weights = checkpoint / _weights_name(peft)
        if not weights.is_file():
            raise ValueError(f"{checkpoint} holds full weights, not a LoRA adapter: resume without use_peft, or from a LoRA run")
        saved = load_file(str(weights))
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
        missing, unexpected = model.load_state_dict(load_file(str(weights)), strict=False)
        # Tied weights were saved once; anything else missing means a different model.
        tied = {n for n in missing if n.endswith("lm_head.weight") and getattr(model.config, "tie_word_embeddings", False)}
        if set(missing) - tied or unexpected:
            raise ValueError(f"{checkpoint} does not fit this model: missing {sorted(set(missing) - tied)[:5]}, unexpected {unexpected[:5]}")
    optimizer.load_state_dict(_load(checkpoint / "optimizer.pt"))
    scheduler.load_state_dict(_load(checkpoint / "scheduler.pt"))
    _set_rng_state(_load(checkpoint / "rng.pt"))
    return TrainerState(step=int(data["step"]), config=data["config"], history=data.get("history", []), extra=data.get("extra", {}))


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


def _load(path: Path) -> Any:
    try:
        with torch.serialization.safe_globals(_NUMPY_ARRAY_GLOBALS):
            return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = next((line.strip() for line in str(exc).splitlines() if "GLOBAL" in line), "")
        raise ValueError(
            f"{path} holds pickled Python objects, which are not loaded (they could run code): {reason}; "
            "resume from a checkpoint saved by agentgym-lightning"
        ) from None
