"""Where agentgym-lightning keeps what it builds or imports (samples, imported data, indexes)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CACHE_ENV_VAR", "cache_root"]

#: Overrides the cache folder.
CACHE_ENV_VAR = "AGENTGYM_LIGHTNING_CACHE"


def cache_root() -> Path:
    """``$AGENTGYM_LIGHTNING_CACHE``, else ``$XDG_CACHE_HOME/agentgym-lightning``, else
    ``~/.cache/agentgym-lightning``."""
    if os.environ.get(CACHE_ENV_VAR):
        return Path(os.environ[CACHE_ENV_VAR]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "agentgym-lightning"
