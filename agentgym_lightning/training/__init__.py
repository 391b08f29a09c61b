"""Reinforcement learning for agents: LightningRL on TRL's losses, with hf or vLLM generation.

::

    from agentgym_lightning import LightningRLConfig, LightningRLTrainer

    result = LightningRLTrainer(LightningRLConfig(env="lightning/Arithmetic-v0", max_steps=20)).train()

The step is :mod:`agentgym_lightning.training.trainer` (read it top to bottom), inside the run loop
every trainer shares (:mod:`.run`); the config is :class:`LightningRLConfig` (on the shared
:mod:`.run_config` base); episodes become rows in :mod:`.samples`, the update's micro-batches and
statistics are :mod:`.update`, the loss is :mod:`.loss`, and :mod:`.token_tree` runs a
micro-batch's rows as one token tree (shared prefixes computed once).
Importing the config is light; the trainer and samples import torch when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentgym_lightning.training.config import LightningRLConfig

if TYPE_CHECKING:
    from agentgym_lightning.training.samples import Sample, SampleBatch, build_samples
    from agentgym_lightning.training.result import TrainResult
    from agentgym_lightning.training.trainer import LightningRLTrainer

__all__ = ["LightningRLConfig", "LightningRLTrainer", "TrainResult", "Sample", "SampleBatch", "build_samples"]

# The config is light (the CLI builds its parser from it); the rest needs torch, so it loads on first use.
_LAZY = {
    "LightningRLTrainer": "agentgym_lightning.training.trainer",
    "TrainResult": "agentgym_lightning.training.result",
    "Sample": "agentgym_lightning.training.samples",
    "SampleBatch": "agentgym_lightning.training.samples",
    "build_samples": "agentgym_lightning.training.samples",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
