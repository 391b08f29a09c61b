"""Checkpoint averaging: the mean of several checkpoints' weights, as one model folder.

Picking a run's best checkpoint by its held-out score picks noise as well (docs/experiments.md,
issue 46: seed 1's 16 of 96 at step 30 was level with its warm start on 344 other problems).
Averaging the weights of the last few checkpoints (checkpoint averaging, as in LAWA, arXiv
2209.14981, and the "model soups" of one run, arXiv 2203.05482) takes the run's trend without
choosing a checkpoint by looking at held-out results; on a run still improving, the mean lags its
last checkpoint (issue 46: +4 and +8 of 344 against the last checkpoints' +9 and +11). ::

    agentgym-lightning average RUN/checkpoints/checkpoint-000040 RUN/checkpoints/checkpoint-000050 --output avg
    agentgym-lightning eval --model avg ...

Each source is what ``init_from`` takes (:func:`~.initial_weights.find_initial_weights`): a run
folder (its ``final/``, else its newest intact checkpoint), a ``final/`` folder or one checkpoint
folder (verified against its manifest first). Only full weights average: LoRA A and B matrices
averaged apart are not the average of their products, so adapters are refused with what to do.
The sources must hold the same tensors (names and shapes), as the checkpoints of one run (or of
runs from one base model) do. The mean is taken in float32 and saved in each tensor's own dtype;
the folder gets the first source's config and tokenizer, and ``averaged_from.json`` says what was
averaged, with which weights. It is written to a temporary sibling and renamed into place, and an
existing folder is never written over.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from agentgym_lightning.training.checkpoint import MANIFEST, non_finite_tensors, read_weights, verify_checkpoint
from agentgym_lightning.training.initial_weights import InitialWeights, find_initial_weights
from agentgym_lightning.training.weights_folder import WEIGHT_SUFFIXES, weights_model_folder

__all__ = ["average_weights", "AVERAGED_FROM"]

#: The file in an averaged model folder that names its sources and their weights.
AVERAGED_FROM = "averaged_from.json"


def _full_weights(source: str | Path) -> InitialWeights:
    found = find_initial_weights(source)
    if found.holds_adapters:
        raise ValueError(
            f"{found.source} holds LoRA adapter weights: averaging A and B apart is not averaging the adapters' updates; "
            "average full weights (a full fine-tune's checkpoints, or final/ folders with the adapter merged)"
        )
    if (found.source / MANIFEST).is_file():
        verify_checkpoint(found.source)  # a corrupt checkpoint is refused before it is read
    return found


def _mixing_weights(count: int, weights: Sequence[float] | None) -> list[float]:
    if weights is None:
        return [1.0 / count] * count
    if len(weights) != count:
        raise ValueError(f"{len(weights)} weights for {count} sources: give one weight a source, or none for a uniform mean")
    if any(not w >= 0 for w in weights) or sum(weights) <= 0:  # `not w >= 0` also refuses NaN
        raise ValueError(f"weights {list(weights)} must be non-negative with a positive sum")
    total = float(sum(weights))
    return [float(w) / total for w in weights]


def _add(total: dict[str, torch.Tensor], weights: dict[str, torch.Tensor], share: float, where: Path) -> None:
    if set(weights) != set(total):
        extra, missing = sorted(set(weights) - set(total)), sorted(set(total) - set(weights))
        raise ValueError(
            f"{where} holds other tensors than the first source (extra {extra[:3]}, missing {missing[:3]}): "
            "only checkpoints of one model average"
        )
    for name, tensor in weights.items():
        if tensor.shape != total[name].shape:
            raise ValueError(f"{where}: {name} has shape {tuple(tensor.shape)}, the first source {tuple(total[name].shape)}")
        if tensor.is_floating_point():
            total[name].add_(tensor.to(torch.float32), alpha=share)
        elif not torch.equal(tensor, total[name]):
            raise ValueError(f"{where}: {name} is not a float tensor and differs from the first source's, so it cannot be averaged")


def average_weights(
    sources: Sequence[str | Path], output: str | Path, *, weights: Sequence[float] | None = None, progress: bool = True
) -> Path:
    """Write the (weighted) mean of ``sources``' full weights to the model folder ``output``.

    ``weights``: one non-negative number a source (normalised to sum to one); ``None``, a uniform
    mean. Raises ``ValueError`` for fewer than two sources, LoRA weights, sources that are not one
    model, an ``output`` that exists or weights that come out non-finite;
    :class:`~.checkpoint.CorruptCheckpointError` for a checkpoint that fails its manifest;
    ``FileNotFoundError`` for a source that is not there. Returns ``output``.
    """
    from safetensors.torch import save_file
    from tqdm.auto import tqdm

    output = Path(output)
    if len(sources) < 2:
        raise ValueError(f"{len(sources)} source(s): averaging takes at least two checkpoints")
    if output.exists():
        raise ValueError(f"{output} exists: give a new folder for the averaged model (nothing is written over)")
    shares = _mixing_weights(len(sources), weights)
    found = [_full_weights(s) for s in sources]  # every source checked before the long part
    total: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for item, share in tqdm(list(zip(found, shares)), desc="average", unit="checkpoint", disable=not progress):
        assert item.file is not None  # full weights always name their file
        tensors = read_weights(item.file)
        if not total:
            dtypes = {name: t.dtype for name, t in tensors.items()}
            total = {name: t.to(torch.float32) * share if t.is_floating_point() else t.clone() for name, t in tensors.items()}
            continue
        _add(total, tensors, share, item.source)
    if bad := non_finite_tensors(total):
        raise ValueError(f"the averaged weights are not finite ({len(bad)} tensors, e.g. {bad[0]}): {output} not written")
    averaged = {name: t.to(dtypes[name]).contiguous() for name, t in total.items()}

    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-", dir=output.parent))
    try:
        with weights_model_folder(found[0].source) as model_folder:
            for item in model_folder.iterdir():  # the config and tokenizer, the links resolved
                if item.is_file() and not item.name.endswith(WEIGHT_SUFFIXES) and item.name != AVERAGED_FROM:
                    shutil.copyfile(item.resolve(), staging / item.name)
        save_file(averaged, str(staging / "model.safetensors"), metadata={"format": "pt"})
        record = {"sources": [str(f.source.resolve()) for f in found], "weights": shares}
        (staging / AVERAGED_FROM).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        os.replace(staging, output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return output
