"""What a training run ends with: its :class:`TrainResult`, or :class:`TrainingStopped` on an error."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["TrainResult", "TrainingStopped"]


@dataclass
class TrainResult:
    """What :meth:`~agentgym_lightning.training.trainer.LightningRLTrainer.train` did."""

    output_dir: Path
    steps: int
    history: list[dict[str, float]] = field(default_factory=list)
    eval_before: dict[str, float] | None = None
    eval_after: dict[str, float] | None = None
    interrupted: bool = False
    #: The signal that interrupted the run (``"SIGINT"``, ``"SIGTERM"``), if one did.
    signal: str | None = None
    messages: list[str] = field(default_factory=list)


class TrainingStopped(RuntimeError):
    """The run stopped on an error (a policy backend that failed ``MAX_POLICY_FAILURES`` batches
    in a row, say) after saving a checkpoint of its last completed step; the error is the
    ``__cause__``, and ``checkpoint`` is where the work is (``None`` when no step had completed)."""

    def __init__(self, message: str, checkpoint: Path | None) -> None:
        super().__init__(message)
        self.checkpoint = checkpoint
