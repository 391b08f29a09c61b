"""The run's progress bar: steps done, the latest train reward and held-out eval (tqdm)."""

from __future__ import annotations

from typing import Any

from agentgym_lightning.training.run_config import RunConfig

__all__ = ["progress_bar"]


def progress_bar(config: RunConfig, initial: int) -> Any:
    """A bar of ``config.total_steps`` steps from ``initial`` (a resumed run's step), off unless ``config.progress``."""
    from tqdm.auto import tqdm

    return tqdm(total=config.total_steps, initial=initial, desc="train", unit="step", disable=not config.progress, dynamic_ncols=True)
