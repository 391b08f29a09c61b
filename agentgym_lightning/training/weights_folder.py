"""A run's trained weights as a model folder any backend loads (``eval --model RUN``).

``RUN`` is what ``init_from`` takes (:func:`~.initial_weights.find_initial_weights`): a run folder
(its ``final/`` when it has one, else its newest intact checkpoint), a ``final/`` folder, or one
checkpoint folder, so a checkpoint from the middle of a run is evaluated without writing anything
into the run. A full fine-tune's ``final/`` is a model folder already. A checkpoint holds only
weights: its ``model.safetensors`` is a valid Hugging Face weights file, so the folder made here
links it beside its base model's config and tokenizer (the run's saved ``model``: what the run
itself loaded them from), in a temporary folder removed when the caller is done, and no weights are
copied. LoRA weights are refused with what to do: an adapter needs its base model and PEFT's files.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agentgym_lightning.policies.models import resolve_model
from agentgym_lightning.training.checkpoint import CHECKPOINT_DIR, CorruptCheckpointError, saved_config, weights_file
from agentgym_lightning.training.initial_weights import find_initial_weights

__all__ = ["WEIGHT_SUFFIXES", "holds_run_weights", "weights_model_folder"]

#: A base model's files that are weights (or their index): the checkpoint's weights replace them.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".index.json")


def holds_run_weights(path: str | Path) -> bool:
    """Whether ``path`` is a training run's folder or one of its checkpoints rather than a model
    folder: a folder with no ``config.json`` that holds ``checkpoints/``, ``final/`` or a
    checkpoint's ``trainer_state.json``."""
    path = Path(path)
    if not path.is_dir() or (path / "config.json").is_file():
        return False
    return any((path / name).exists() for name in (CHECKPOINT_DIR, "final", "trainer_state.json"))


@contextmanager
def weights_model_folder(path: str | Path) -> Iterator[Path]:
    """A model folder holding the trained weights at ``path`` (see the module docstring), valid
    inside the ``with`` block. Raises ``ValueError`` for LoRA weights and ``FileNotFoundError``
    (a :class:`~agentgym_lightning.policies.models.ModelNotFoundError` for a missing base model)
    when there is nothing to load."""
    weights = find_initial_weights(path)
    if weights.holds_adapters:
        raise ValueError(
            f"{weights.source} holds LoRA adapter weights, not a whole model: evaluate the run's base model with its "
            "adapter through the run itself (eval_steps, or train --resume RUN --steps N, which evaluates at the end)"
        )
    if (weights.source / "config.json").is_file():  # a final/ folder: a model folder as it is
        yield weights.source
        return
    try:
        base_name = saved_config(weights.source)["model"]
    except (CorruptCheckpointError, KeyError) as exc:
        raise FileNotFoundError(
            f"{weights.source}: cannot tell which base model its weights belong to ({exc}); "
            "write the run's final/ with train --resume RUN --steps N and evaluate that"
        ) from exc
    base = resolve_model(base_name, progress=False)
    folder = Path(tempfile.mkdtemp(prefix="agentgym-weights-"))
    try:
        for item in base.iterdir():
            if item.is_file() and not item.name.endswith(WEIGHT_SUFFIXES):
                (folder / item.name).symlink_to(item.resolve())
        assert weights.file is not None  # full weights always name their file
        (folder / weights_file(False)).symlink_to(weights.file.resolve())
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
