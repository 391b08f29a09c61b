"""Reinforcement learning for agents: LightningRL on TRL's losses, with hf or vLLM generation.

::

    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer

    result = LightningRLTrainer(LightningRLConfig(env="lightning/Arithmetic-v0", max_steps=20)).train()

The loop is :mod:`agentgym_lightning.training.trainer` (read it top to bottom); the config is
:class:`LightningRLConfig`; episodes become rows in :mod:`.samples` and the loss is :mod:`.loss`.
Importing this package imports torch (``import agentgym_lightning`` does not).
"""

from __future__ import annotations

from agentgym_lightning.training.config import LightningRLConfig
from agentgym_lightning.training.samples import Sample, SampleBatch, build_samples
from agentgym_lightning.training.trainer import LightningRLTrainer, TrainResult

__all__ = ["LightningRLConfig", "LightningRLTrainer", "TrainResult", "Sample", "SampleBatch", "build_samples"]
