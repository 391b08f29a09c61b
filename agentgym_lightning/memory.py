"""Memory a phase freed, given back to the OS before the next phase peaks (glibc's ``malloc_trim``).

A training step's phases peak in turn: the rollout on its KV caches (grown a token at a time), the
update on its gradients and activations, an evaluation on its own KV caches. On its own glibc
returns only the free memory at the top of its heaps, so what a phase freed below a chunk still in
use stays resident under the next phase's peak, and the process peaks at the phases' sum.

Within a phase the opposite holds: the same large buffers (a layer's attention scores, its MLP
activations, a decode step's logits) are freed and allocated again many times a second. glibc
maps each block over its mmap threshold (at most 32 MiB) on its own and unmaps it when freed, so
every allocation of it touches fresh pages the kernel must fault in and zero: the main job took
5-6 million page faults, 12 % of its CPU-seconds in the kernel. :func:`reuse_freed_memory` keeps
those blocks in the heap for reuse, and :func:`release_freed_memory` at the phase boundaries still
returns them (docs/training.md, "The main job").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
from typing import Any

__all__ = ["release_freed_memory", "reuse_freed_memory"]


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


# mallopt's parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
#: The environment variables through which a user sets those parameters themselves.
_MALLOC_ENV = ("MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def reuse_freed_memory() -> bool:
    """Make glibc keep what a phase frees for the phase's next allocations rather than returning
    it at once: no block of its own mapping (``M_MMAP_MAX`` 0) and no automatic trim of the heap's
    top (``M_TRIM_THRESHOLD`` 1 GiB), so :func:`release_freed_memory` between phases is what gives
    memory back. Returns whether it was set: not off glibc, and not when the user tuned malloc
    through its environment variables (``MALLOC_MMAP_MAX_`` and the like), which are left as they are.

    A request a heap cannot hold is still mapped (glibc falls back to ``mmap``). Process-wide:
    the trainer calls it when it starts."""
    if _GLIBC is None or any(name in os.environ for name in _MALLOC_ENV):
        return False
    return bool(_GLIBC.mallopt(_M_MMAP_MAX, 0)) and bool(_GLIBC.mallopt(_M_TRIM_THRESHOLD, 2**30))
