"""What a command asks of a trainer: :class:`RunTrainer`, the interface the RL trainer
(:class:`~agentgym_lightning.training.trainer.LightningRLTrainer`) and the SFT trainer
(:class:`~agentgym_lightning.training.sft.trainer.SFTTrainer`) share, so that ``train`` and ``sft``
run either the same way (``agentgym_lightning.commands.train.run_trainer``). Both are
run loops (:class:`~agentgym_lightning.training.run.RunLoop`, which implements it)."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from agentgym_lightning.training.agent_adapters import AgentAdapters
from agentgym_lightning.training.result import TrainResult
from agentgym_lightning.training.run_checkpoints import RunCheckpoints

__all__ = ["RunTrainer"]


@runtime_checkable
class RunTrainer(Protocol):
    """A trainer a command builds, checks and runs (``isinstance`` checks that it has every member)."""

    #: The run's checkpoints (their model and optimizer tell how much room one takes).
    checkpoints: RunCheckpoints
    #: ``lora_per_agent``: the agents' adapters (``None``: one set of trained weights).
    adapters: AgentAdapters | None

    @property
    def is_main_rank(self) -> bool:
        """Whether this process leads the run (checkpoints, reports, sums up): rank 0 of N
        ranks, or the only one. A follower rank only trains."""
        ...

    def train(self, resume_from: str | Path | None = None) -> TrainResult:
        """Run the training (from the checkpoint at ``resume_from``); closes what the trainer built when it ends."""
        ...

    def close(self) -> None:
        """Release what the trainer built (a policy built from the config among it; one passed in is the caller's). Idempotent."""
        ...
