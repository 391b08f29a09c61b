"""What goes wrong with a verifiers environment, kept apart so the plugin (loaded on every
``import agentgym_lightning``) reads them without loading anything else."""

from __future__ import annotations

__all__ = ["VerifiersLoadError", "VerifiersRolloutError"]


class VerifiersLoadError(ValueError):
    """A verifiers environment could not be loaded (``--env`` or ``--env-kwarg`` is wrong): the
    message names it and says what to give instead."""


class VerifiersRolloutError(RuntimeError):
    """A verifiers environment's rollout raised or stopped with an error: the environment's fault,
    so its episode ends ``infra_failed`` (``plugin.py``); the message names it."""
