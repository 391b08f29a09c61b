"""Supervised fine-tuning on episodes: SFT on the best episodes, rejection sampling, distillation.

::

    from agentgym_lightning import SFTConfig, SFTTrainer

    SFTTrainer(SFTConfig(sources=["runs/main"], top_k=2, min_reward=1.0)).train()
    # agentgym-lightning sft runs/main --top-k 2 --min-reward 1 --output-dir runs/sft

The step is :mod:`.trainer`, in the run loop RL's trainer runs too
(:mod:`agentgym_lightning.training.run`); the config :class:`SFTConfig` (on the RL config's base,
:mod:`agentgym_lightning.training.run_config`); which episodes :mod:`.episodes`; their rows :mod:`.rows`; a teacher's text in the
student's tokens :mod:`.retokenize`. The config is light; the trainer loads torch on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentgym_lightning.training.sft.config import SFTConfig

if TYPE_CHECKING:
    from agentgym_lightning.training.sft.trainer import SFTTrainer

__all__ = ["SFTConfig", "SFTTrainer"]


def __getattr__(name: str) -> Any:
    if name == "SFTTrainer":
        from agentgym_lightning.training.sft.trainer import SFTTrainer

        return SFTTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
