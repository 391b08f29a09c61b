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

Asynchronous training runs the update and a CPU generator's decode at once, each with an OpenMP
team of its own; with torch's default (a thread per core each) they are twice as many threads as
cores, and a team whose thread is descheduled waits for it at every barrier.
:func:`share_cores` splits the cores between them instead (:func:`split_threads`), and
:func:`torch_threads` sets a thread's count for a span.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["SpinningThreadsWarning", "sleeping_cpu_threads", "warn_if_threads_spin", "split_threads", "share_cores", "torch_threads"]

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


def split_threads(total: int) -> tuple[int, int]:
    """``(update, generator)`` torch threads for an update and a decode that run at once on
    ``total`` threads' worth of cores: a quarter (at least one) to the decode, which is
    memory-bound at a few rows, the rest (at least one) to the update. On 2 cores: one each."""
    if total < 1:
        raise ValueError(f"total must be >= 1 thread, got {total}")
    generator = max(1, total // 4)
    return max(1, total - generator), generator


def share_cores(generator: Any, *, update_on_cpu: bool) -> Callable[[], None]:
    """Split this thread's torch threads (the update's) with ``generator``'s decode while both run
    at once (:func:`split_threads`): this thread gets the update's share and the generator's
    ``decode_threads`` the rest. Returns what puts both back. Nothing to split (a no-op back) when
    the update or the generator runs on a GPU, or the generator has no ``decode_threads`` (it
    decodes elsewhere: a vLLM engine, a server)."""
    device = getattr(getattr(generator, "device", None), "type", None)
    if not update_on_cpu or device != "cpu" or not hasattr(generator, "decode_threads"):
        return lambda: None
    import torch

    total, before = torch.get_num_threads(), generator.decode_threads
    update, decode = split_threads(total)
    torch.set_num_threads(update)
    generator.decode_threads = decode

    def back() -> None:
        torch.set_num_threads(total)
        generator.decode_threads = total if before is None else before

    return back


@contextlib.contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """This thread's torch (OpenMP) threads are ``count`` for the span, and back after
    (``None``: left as they are). OpenMP keeps a count per thread: other threads keep theirs."""
    if count is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    if before == count:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
