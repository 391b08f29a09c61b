"""A run's checkpoints as the trainer takes them: every ``save_steps``, on the way out, final, resumed.

:mod:`.checkpoint` writes and reads one checkpoint; :class:`RunCheckpoints` is what the trainer
asks of them: save the current step (warning, and keeping the previous one, when it cannot be
written), know whether a step is saved, write the ``final/`` model, and resume a run only with the
config fields that decide what it computes unchanged (:data:`RUN_IDENTITY`), setting aside what
the run wrote after the checkpoint: episode files, later checkpoints, a stale ``final/``
(:meth:`RunCheckpoints.set_aside_after`).
"""

from __future__ import annotations

import os
import re
import shutil
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from agentgym_lightning.training.checkpoint import (
    CheckpointNotSavedWarning,
    NonFiniteWeightsError,
    TrainerState,
    checkpoint_step,
    checkpoints_of,
    find_checkpoint,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    save_final_model,
    saved_config,
)

__all__ = ["RUN_IDENTITY", "SUPERSEDED", "RunCheckpoints"]

#: Config fields that decide what a run computes: a resumed run must not change them.
RUN_IDENTITY = (
    "env", "env_kwargs", "model", "seed", "tasks_per_step", "num_generations", "use_peft", "lora_r", "lora_alpha",
    "lora_target_modules", "aggregation", "credit", "credit_kwargs", "air_weights", "loss_type", "learning_rate",
    "temperature", "top_p", "max_completion_length", "agent_match", "lora_per_agent", "agent_advantages", "optim",
)

#: Where a resumed run moves the episode files of steps after its checkpoint, in the run folder
#: (``superseded/trajectories/step-N.jsonl``...): kept, but out of what the viewer and report read.
SUPERSEDED = "superseded"

#: The run folder's per-step episode files (``trajectories/``: a training step's; ``eval/``: the
#: held-out evaluation after a step).
_STEP_FOLDERS = ("trajectories", "eval")
_STEP_FILE = re.compile(r"^step-(\d+)\.jsonl$")


class RunCheckpoints:
    """The checkpoints of the run in ``output_dir``: of ``model`` (its LoRA adapter with
    ``use_peft``; each of ``adapters`` with ``lora_per_agent``), ``optimizer`` and ``scheduler``.

    ``config`` is the run's config dataclass (:class:`LightningRLConfig`, or the SFT trainer's
    ``SFTConfig``: anything with ``use_peft``, ``save_total_limit``, ``to_dict``, ``from_dict`` and
    ``field_names``), saved with every checkpoint; ``identity`` names its fields that a resumed run
    must not change (default: :data:`RUN_IDENTITY`)."""

    def __init__(
        self,
        output_dir: Path,
        config: Any,
        *,
        model: Any,
        tokenizer: Any,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        adapters: Sequence[str] | None = None,
        identity: Sequence[str] = RUN_IDENTITY,
    ) -> None:
        self.output_dir = output_dir
        self.config = config
        self.identity = tuple(identity)
        self.model, self.tokenizer, self.optimizer, self.scheduler = model, tokenizer, optimizer, scheduler
        self.adapters = adapters
        #: The step of the newest checkpoint this run saved or resumed from (0: none).
        self.last_saved = 0

    def newest(self) -> Path | None:
        """The run folder's newest checkpoint (``None`` when there is none)."""
        return latest_checkpoint(self.output_dir)

    def is_saved(self, step: int) -> bool:
        """Whether ``step`` is the step of the newest checkpoint this run saved or resumed from."""
        return self.last_saved == step

    def save(self, step: int, history: list[dict[str, float]], extra: dict[str, Any] | None = None) -> Path | None:
        """Checkpoint ``step`` (and ``extra``: JSON the run resumes with, the asynchronous
        rollouts' buffer); returns where. A checkpoint that cannot be written (a full disk,
        weights that are not finite) is warned about, and the previous one stands: the newest
        checkpoint is returned (``None`` when there is none)."""
        try:
            saved = save_checkpoint(
                self.output_dir,
                model=self.model,
                peft=self.config.use_peft,
                adapters=self.adapters,
                optimizer=self.optimizer,
                scheduler=self.scheduler,
                state=TrainerState(step=step, config=self.config.to_dict(), history=history, extra=extra or {}),
                keep=self.config.save_total_limit,
            )
        except (OSError, NonFiniteWeightsError) as exc:
            kept = self.newest()
            why = f"{exc.strerror} ({exc.filename})" if isinstance(exc, OSError) and exc.strerror else str(exc)
            warnings.warn(
                f"the checkpoint of step {step} was not saved: {why}; "
                + (f"the previous one, {kept}, is kept" if kept is not None else "there is no earlier checkpoint"),
                CheckpointNotSavedWarning,
                stacklevel=2,
            )
            return kept
        self.last_saved = step
        return saved

    def resume(self, path: str | Path) -> TrainerState:
        """Restore the weights, optimizer, scheduler and RNG states of the checkpoint at ``path``
        (a checkpoint, or a run folder: its newest); returns its state. A checkpoint of a run
        whose identity fields (:data:`RUN_IDENTITY`) differ from this config's are refused (``ValueError``)."""
        checkpoint = find_checkpoint(path)
        kind = type(self.config)
        saved = kind.from_dict(saved_config(checkpoint, kind.field_names()))
        changed = [k for k in self.identity if getattr(saved, k) != getattr(self.config, k)]
        if changed:
            raise ValueError(
                f"cannot resume from {checkpoint}: the run's {', '.join(changed)} changed (saved: "
                + ", ".join(f"{k}={getattr(saved, k)!r}" for k in changed)
                + "); resume with the saved config (the train command's --resume does)"
            )
        state = load_checkpoint(
            checkpoint, model=self.model, peft=self.config.use_peft, optimizer=self.optimizer, scheduler=self.scheduler,
            adapters=self.adapters,
        )
        self.last_saved = state.step
        return state

    def set_aside_after(self, step: int) -> list[Path]:
        """Move what the run folder holds of the steps after ``step`` to :data:`SUPERSEDED`: the
        episode files (``trajectories/`` and ``eval/``: what the run wrote after the checkpoint it
        resumes, up to a step cut short by a kill), the later checkpoints, and ``final/`` when the
        run had gone past ``step`` (a model of a later step, or of the end of a run now taken
        back); replacing any of the same name there. Returns where they went; nothing is deleted.
        Left in place, the episode files would stand beside the resumed run's as one run's
        episodes, and a later checkpoint would be :meth:`newest` (a kill before the resumed run's
        first save, a resume of the folder, ``init_from``, would take it, or ``final/``, for
        this run's). ``metrics.jsonl`` is cut back the same way by its plugin."""
        moved: list[Path] = []
        for folder in _STEP_FOLDERS:
            source = self.output_dir / folder
            if not source.is_dir():
                continue
            for path in sorted(source.iterdir()):
                match = _STEP_FILE.match(path.name)
                if match is not None and int(match.group(1)) > step and path.is_file():
                    moved.append(self._set_aside(path))
        later = [c for c in checkpoints_of(self.output_dir) if checkpoint_step(c) > step]
        moved.extend(self._set_aside(c) for c in later)
        final = self.output_dir / "final"
        if moved and final.is_dir() and not final.is_symlink():
            moved.append(self._set_aside(final))
        return moved

    def _set_aside(self, path: Path) -> Path:
        """Move ``path`` (in the run folder) to the same place under :data:`SUPERSEDED`; returns where."""
        target = self.output_dir / SUPERSEDED / path.relative_to(self.output_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)  # an earlier resume's, of the same name: os.replace cannot replace a folder
        os.replace(path, target)
        return target

    def set_aside_message(self, step: int, moved: Sequence[Path]) -> list[str]:
        """What a resume at ``step`` says of what :meth:`set_aside_after` moved (nothing when nothing was)."""
        if not moved:
            return []
        names = ", ".join(str(p.relative_to(self.output_dir / SUPERSEDED)) for p in moved)
        return [f"resumed at step {step}: what the run wrote after it was moved to {self.output_dir / SUPERSEDED} ({names})"]

    def save_final(self, step: int) -> str | None:
        """Write the trained model to ``final/``; returns what went wrong (a full disk: warned,
        the checkpoints stand), or ``None``.

        The run checkpoints its last step: ``final/`` links those weights, no second copy (and
        writes them when that checkpoint is not in this run's folder or could not be saved)."""
        checkpoint = self.newest()
        if not self.is_saved(step) or checkpoint is None or checkpoint.name != f"checkpoint-{step:06d}":
            checkpoint = None
        try:
            save_final_model(
                self.output_dir / "final", model=self.model, tokenizer=self.tokenizer, peft=self.config.use_peft,
                checkpoint=checkpoint, adapters=self.adapters,
            )
        except (OSError, NonFiniteWeightsError) as exc:  # a full disk, NaN weights: the checkpoints stand, say so
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            message = f"the final model was not saved in {self.output_dir / 'final'}: {why}; the last checkpoint is kept"
            warnings.warn(message, CheckpointNotSavedWarning, stacklevel=3)
            return message
        return None
