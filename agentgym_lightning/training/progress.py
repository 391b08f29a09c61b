"""The run's progress bar: steps done, the latest train reward and held-out eval (tqdm)."""

from __future__ import annotations

from typing import Any

from agentgym_lightning.training.config import LightningRLConfig

__all__ = ["progress_bar"]


def progress_bar(config: LightningRLConfig, initial: int) -> Any:
    """A bar of ``config.max_steps`` steps from ``initial`` (a resumed run's step), off unless ``config.progress``."""
    from tqdm.auto import tqdm

    return tqdm(total=config.max_steps, initial=initial, desc="train", unit="step", disable=not config.progress, dynamic_ncols=True)
