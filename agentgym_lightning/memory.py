"""Memory a phase freed, given back to the OS before the next phase peaks (glibc's ``malloc_trim``).

A training step's phases peak in turn: the rollout on its KV caches (grown a token at a time), the
update on its gradients and activations, an evaluation on its own KV caches. On its own glibc
returns only the free memory at the top of its heaps, so what a phase freed below a chunk still in
use stays resident under the next phase's peak, and the process peaks at the phases' sum.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
from typing import Any

__all__ = ["release_freed_memory"]


def _glibc() -> Any:
    if platform.libc_ver()[0] != "glibc":
        return None
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


_GLIBC = _glibc()


def release_freed_memory() -> bool:
    """Give the memory a phase freed back to the OS (glibc's ``malloc_trim``); returns whether it
    could (``False`` off glibc, where this is a no-op).

    ``malloc_trim`` returns every free page, not only those at the top of the heap; it takes
    milliseconds."""
    if _GLIBC is None:
        return False
    _GLIBC.malloc_trim(0)
    return True
