"""What a training run ends with: its :class:`TrainResult`, or :class:`TrainingStopped` on an error
(:func:`run_until_stopped`: how the RL and SFT trainers' loops may end)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agentgym_lightning.failed_episodes import EpisodesFailedError
from agentgym_lightning.training.signals import Terminated, ignore_interrupts, interrupt_once, terminate_as_interrupt

__all__ = ["TrainResult", "TrainingStopped", "run_until_stopped"]


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


def run_until_stopped(
    loop: Callable[[], None], result: TrainResult, *, save_progress: Callable[[], Path | None], step: Callable[[], int],
    once: bool = False,
) -> bool:
    """Run a trainer's ``loop`` with SIGTERM taken as Ctrl-C; returns whether it completed.

    Ctrl-C or SIGTERM: ``save_progress()`` (the last completed step's checkpoint) and return
    ``False`` with ``result.interrupted`` and ``result.signal`` set; with ``once`` (rank 0 of N
    ranks) later ones are ignored from the first on (:func:`~.signals.interrupt_once`). An error:
    ``save_progress()`` too, then :class:`TrainingStopped` from it, naming the step it stopped at
    (``step()``: the steps completed) and the checkpoint; an :class:`EpisodesFailedError` is
    raised as is."""
    try:
        with interrupt_once() if once else terminate_as_interrupt():
            loop()
        return True
    except KeyboardInterrupt as exc:
        if once:
            ignore_interrupts()  # one held through an update (deferred_interrupt) is raised here
        result.interrupted = True
        result.signal = "SIGTERM" if isinstance(exc, Terminated) else "SIGINT"
        save_progress()
        return False
    except Exception as exc:
        saved = save_progress()
        if isinstance(exc, EpisodesFailedError):
            raise
        where = f"checkpoint of step {step()} in {saved.parent}" if saved is not None else "no step had completed"
        raise TrainingStopped(f"the run stopped at step {step() + 1}: {exc!r} ({where})", saved) from exc
