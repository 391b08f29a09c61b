"""Idle OpenMP threads sleep rather than spin (``OMP_WAIT_POLICY=PASSIVE``), for the command and
the Python API alike.

A training run keeps torch's threads next to its own (the gateway, the agents, the driver), and
torch's OpenMP threads spin at the end of every parallel region waiting for the others. On a
2-core machine with anything else running, a spinning thread keeps the core its sibling needs: a
4-row, 40-token greedy decode of SmolLM2 with two threads took 49 CPU-seconds spinning and 4.8
sleeping (3.6 on one thread), on the same machine at the same load; the Python API, before it
slept too, took 4x the CPU of the command for the same run on a loaded machine (210 vs 50.7 CPU-s).

OpenMP reads the policy once, when torch loads it. So ``import agentgym_lightning`` (which any
``from agentgym_lightning... import`` runs first) sets it (:func:`sleeping_cpu_threads`) unless
the user chose a policy or torch is loaded already; in that last case the trainer warns once
(:func:`warn_if_threads_spin`, :class:`SpinningThreadsWarning`) with what to do.
"""

from __future__ import annotations

import os
import sys
import warnings

__all__ = ["SpinningThreadsWarning", "sleeping_cpu_threads", "warn_if_threads_spin"]

_warned = False


class SpinningThreadsWarning(RuntimeWarning):
    """torch was imported before agentgym_lightning and no ``OMP_WAIT_POLICY`` was set: its idle
    OpenMP threads spin, which can cost several times the CPU on a busy machine."""


def sleeping_cpu_threads() -> bool:
    """Make idle OpenMP threads sleep rather than spin (``OMP_WAIT_POLICY=PASSIVE``), unless the
    user chose a policy; returns whether it was set. Only before torch is first imported: OpenMP
    reads it once, when torch loads it. ``import agentgym_lightning`` calls it."""
    if "torch" in sys.modules or "OMP_WAIT_POLICY" in os.environ:
        return False
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True


def warn_if_threads_spin(num_threads: int) -> bool:
    """Warn once per process (:class:`SpinningThreadsWarning`) when OpenMP runs ``num_threads`` > 1
    threads with no wait policy set (torch was imported before agentgym_lightning); returns
    whether it warned. The trainer calls it."""
    global _warned
    if _warned or num_threads <= 1 or "OMP_WAIT_POLICY" in os.environ:
        return False
    _warned = True
    warnings.warn(
        "torch was imported before agentgym_lightning, so its idle OpenMP threads spin instead of sleeping "
        "(OMP_WAIT_POLICY is read once, when torch loads): on a busy machine that costs several times the CPU. "
        "Import agentgym_lightning before torch, or start Python with OMP_WAIT_POLICY=PASSIVE "
        "(OMP_WAIT_POLICY=ACTIVE keeps spinning and silences this).",
        SpinningThreadsWarning,
        stacklevel=3,  # the caller of LightningRLTrainer(...)
    )
    return True
