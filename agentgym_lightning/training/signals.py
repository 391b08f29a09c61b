"""How a run meets Ctrl-C and SIGTERM: never between an update and its checkpoint, always with a checkpoint.

* :func:`terminate_as_interrupt` — SIGTERM (``docker stop``, a scheduler's preemption) raises
  :class:`Terminated`, a ``KeyboardInterrupt``: the trainer ends the run as on Ctrl-C, with a
  checkpoint of the last completed step.
* :func:`deferred_interrupt` — both signals are held while a step updates, syncs and checkpoints
  (a stop there would leave half-updated weights), and raised after it
  (:meth:`HeldSignal.raise_if_received`).
* :func:`interrupt_once` — on N ranks, the first Ctrl-C or SIGTERM stops the run and later ones
  are ignored (:func:`ignore_interrupts`): a terminal's Ctrl-C reaches every rank and the launcher
  forwards it again, and a second one would cut short the checkpoint and the summary.

Off the main thread (where Python cannot install handlers) both do nothing.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["HeldSignal", "Terminated", "deferred_interrupt", "ignore_interrupts", "interrupt_once", "terminate_as_interrupt"]


class Terminated(KeyboardInterrupt):
    """SIGTERM (``docker stop``, a scheduler's preemption): handled as Ctrl-C is."""


class HeldSignal:
    """The signal :func:`deferred_interrupt` held, if one came (``signum``)."""

    signum: int | None = None

    def raise_if_received(self) -> None:
        """Raise what the held signal would have: :class:`Terminated` for SIGTERM, else ``KeyboardInterrupt``."""
        if self.signum == signal.SIGTERM:
            raise Terminated
        if self.signum is not None:
            raise KeyboardInterrupt


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[HeldSignal]:
    """Hold Ctrl-C and SIGTERM until the block (update, sync, checkpoint) is done, so a stop
    never leaves half-updated weights; the caller re-raises after (``held.raise_if_received()``)."""
    held = HeldSignal()
    if threading.current_thread() is not threading.main_thread():
        yield held
        return

    def handler(signum: int, frame: Any) -> None:
        held.signum = signum

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield held
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` (a ``KeyboardInterrupt``), so ``docker stop`` or a
    scheduler ends a run as Ctrl-C does: with a checkpoint of the last completed step."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def ignore_interrupts() -> None:
    """Ctrl-C and SIGTERM ignored for the rest of the process (a stopping rank's: see
    :func:`interrupt_once`). Off the main thread, nothing."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)


@contextlib.contextmanager
def interrupt_once() -> Iterator[None]:
    """Ctrl-C raises ``KeyboardInterrupt`` and SIGTERM :class:`Terminated`, once: the handler
    ignores both before it raises, so no second signal can land while the run saves its last
    step and sums up. For a rank of ``--nproc-per-node``: a terminal's Ctrl-C reaches it, and the
    launcher forwards the launcher's own to it as well (issue 50 item 8: rank 0's summary was lost
    to the second one under load)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = False

    def handler(signum: int, frame: Any) -> None:
        nonlocal raised
        raised = True
        ignore_interrupts()
        if signum == signal.SIGTERM:
            raise Terminated
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        if not raised:
            for sig, old in previous.items():
                signal.signal(sig, old)
