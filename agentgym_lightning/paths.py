"""Where agentgym-lightning keeps what it builds or imports (samples, imported data, indexes)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["CACHE_ENV_VAR", "cache_root", "link_into_cache", "build_once"]

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


def link_into_cache(src: str | os.PathLike[str], target: Path, *, copy: bool = False, force: bool = False) -> Path:
    """Make ``target`` (in the cache) a symbolic link to the folder or file ``src``, or a copy of it.

    A previous link is replaced; a previous copy only with ``force`` (else ``FileExistsError``).
    Copies land atomically; where symbolic links are not allowed, the folder is copied.
    """
    import shutil
    import tempfile

    source = Path(src).expanduser().resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink():
        target.unlink()
    elif target.exists():
        if not force:
            raise FileExistsError(f"{target} already holds an imported copy; pass --force to replace it")
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    if copy:
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-copy-", dir=target.parent))
        if source.is_dir():
            shutil.copytree(source, tmp / target.name)
        else:
            shutil.copy2(source, tmp / target.name)
        os.replace(tmp / target.name, target)
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        try:
            target.symlink_to(source, target_is_directory=source.is_dir())
        except OSError:  # no symbolic links here (some Windows setups): copy instead
            shutil.copytree(source, target) if source.is_dir() else shutil.copy2(source, target)
    return target


def build_once(final: Path, build: Callable[[Path], object], is_complete: Callable[[Path], bool]) -> Path:
    """``final``, built by ``build(tmp)`` into a temporary folder beside it and renamed into place
    unless ``is_complete(final)`` already; a concurrent builder that wins the race is fine."""
    import shutil
    import tempfile

    if is_complete(final):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        build(tmp)
        try:
            os.replace(tmp, final)
        except OSError:
            if not is_complete(final):  # not a concurrent builder that won the race
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
