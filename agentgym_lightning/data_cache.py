"""Where agentgym-lightning keeps data it builds or imports, shared by every bundled data set.

``<cache>`` is ``$AGENTGYM_LIGHTNING_CACHE``, else ``$XDG_CACHE_HOME/agentgym-lightning``, else
``~/.cache/agentgym-lightning``. ``agentgym-lightning data NAME PATH`` puts a link to (or a copy
of) a local download at ``<cache>/NAME`` with :func:`import_into_cache`; the envs look there
after their ``data_dir=`` argument and their environment variable.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["CACHE_ENV_VAR", "cache_root", "import_into_cache"]

CACHE_ENV_VAR = "AGENTGYM_LIGHTNING_CACHE"


def cache_root() -> Path:
    """Where agentgym-lightning keeps data it builds or imports."""
    if os.environ.get(CACHE_ENV_VAR):
        return Path(os.environ[CACHE_ENV_VAR]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "agentgym-lightning"


def import_into_cache(path: str | os.PathLike[str], name: str, *, copy: bool = False, force: bool = False) -> Path:
    """Make ``<cache>/<name>`` the folder or file at ``path`` (a symbolic link, or a copy with
    ``copy``); returns ``<cache>/<name>``.

    A previous link is replaced; a previous copy only with ``force`` (else ``FileExistsError``).
    Where symbolic links cannot be made, it copies.
    """
    src = Path(path).expanduser().resolve()
    target = cache_root() / name
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink():
        target.unlink()
    elif target.exists():
        if not force:
            raise FileExistsError(f"{target} already holds an imported copy; pass --force to replace it")
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    if copy:
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-copy-", dir=target.parent))
        if src.is_dir():
            shutil.copytree(src, tmp / name)
        else:
            shutil.copy2(src, tmp / name)
        os.replace(tmp / name, target)
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        try:
            target.symlink_to(src, target_is_directory=src.is_dir())
        except OSError:  # no symlinks here (some Windows setups): copy instead
            shutil.copytree(src, target) if src.is_dir() else shutil.copy2(src, target)
    return target
