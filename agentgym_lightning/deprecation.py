"""One-release aliases for modules that moved: the old import path keeps working, with a warning."""

from __future__ import annotations

import importlib
import sys
import warnings

__all__ = ["moved_module"]


def moved_module(old: str, new: str) -> None:
    """Make module ``old`` the module ``new``, with a :class:`DeprecationWarning` at its import.

    The old name then *is* the new module (every name, private ones too, and the same objects),
    so code importing either sees one module. Call it from the old module's body::

        moved_module("agentgym_lightning.conformance", "agentgym_lightning.testing.conformance")
    """
    module = importlib.import_module(new)
    # stacklevel 3: the warning points at the import of the old name, not at this helper (Python skips
    # the import system's frames), so it shows by default where __main__ imports it.
    warnings.warn(
        f"{old} moved to {new}; import it from there (the old name goes in the next release)",
        DeprecationWarning,
        stacklevel=3,
    )
    sys.modules[old] = module
