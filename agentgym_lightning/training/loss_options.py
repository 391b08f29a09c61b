"""``LossOptions``: the options of the update's loss, typed, apart from any config.

Its own module, free of torch and of the configs, so that both the configs (which answer their
run's ``loss_options``) and :mod:`~agentgym_lightning.training.loss` (which reads them) import it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LossOptions"]


@dataclass(frozen=True)
class LossOptions:
    """The loss's own options, as :class:`~agentgym_lightning.training.config.LightningRLConfig`
    names them (TRL's ``GRPOConfig`` names; ``epsilon_high`` is the config's ``epsilon_upper``):
    what :func:`~agentgym_lightning.training.loss.policy_loss` reads, and what a run's config
    answers as its ``loss_options`` (:class:`~agentgym_lightning.training.run_config.RunConfig`)."""

    loss_type: str
    beta: float = 0.0
    use_bias_correction_kl: bool = True
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    delta: float | None = None
    importance_sampling_level: str = "token"
    sampling_correction: bool = True
    sampling_correction_mode: str = "token_truncate"
    sampling_correction_clip_min: float | None = None
    sampling_correction_clip_max: float | None = 3.0
