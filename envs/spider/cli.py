"""``agentgym-lightning data spider [PATH]``: validate a Spider download and import it.

Importing makes ``<cache>/spider`` point at the download (a symbolic link; ``--copy`` copies
instead; a ``.zip`` is unpacked there), which is where ``lightning/Spider-v0`` looks when neither
``data_dir=`` nor ``$AGENTGYM_LIGHTNING_SPIDER_DIR`` is given. Without PATH the command says
which data the env would use now.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import warnings
import zipfile
from pathlib import Path

from agentgym_lightning.paths import link_into_cache

from .data import (
    ENV_VAR,
    SpiderDataError,
    SpiderDataWarning,
    imported_spider_dir,
    load_spider,
    resolve_spider_dir,
    validate_spider_dir,
)

__all__ = ["register_data_command", "run_spider_command", "import_spider"]


def register_data_command(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    """Add ``spider`` to the ``data`` command's subparsers."""
    parser = subparsers.add_parser(
        "spider",
        help="validate a Spider download and import it for lightning/Spider-v0",
        description=(
            "Validate a Spider download (the unzipped spider/ folder with dev.json, train_spider.json, "
            "tables.json and database/, or spider.zip) and make lightning/Spider-v0 use it. "
            "Without PATH, show which Spider data the env uses now."
        ),
    )
    parser.add_argument("path", nargs="?", help="the Spider folder or spider.zip")
    parser.add_argument("--check-gold", action="store_true", help="also run every gold query (a few seconds)")
    parser.add_argument("--copy", action="store_true", help="copy the folder into the cache instead of linking it")
    parser.add_argument("--no-import", action="store_true", help="only validate; change nothing")
    parser.add_argument("--force", action="store_true", help="replace a previously imported copy")
    parser.set_defaults(func=run_spider_command)
    return parser


def _status() -> int:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SpiderDataWarning)
            root, source = resolve_spider_dir()
            dev = load_spider("dev")
    except SpiderDataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    where = {
        "env": f"from ${ENV_VAR}",
        "cache": f"imported ({imported_spider_dir()})",
        "sample": "the bundled sample (no Spider data found)",
        "argument": "given",
    }[source]
    print(f"lightning/Spider-v0 uses {root}: {where}; dev has {len(dev)} usable questions")
    if source == "sample":
        print("Import real Spider with: agentgym-lightning data spider PATH")
    return 0


def _unzip(zip_path: Path, dest_parent: Path) -> Path:
    """Unpack a Spider zip next to the cache and return the Spider folder inside it."""
    tmp = Path(tempfile.mkdtemp(prefix=".spider-unzip-", dir=dest_parent))
    with zipfile.ZipFile(zip_path) as zf:
        zf.extractall(tmp)  # extractall drops absolute paths and '..' parts
    candidates = [p.parent for p in tmp.rglob("dev.json")]
    if not candidates:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SpiderDataError(f"{zip_path} holds no dev.json: not a Spider release")
    return min(candidates, key=lambda p: len(p.parts))


def import_spider(path: str | os.PathLike[str], *, copy: bool = False, force: bool = False) -> Path:
    """Make ``<cache>/spider`` the given (validated) Spider folder; returns it."""
    try:
        return link_into_cache(path, imported_spider_dir(), copy=copy, force=force)
    except FileExistsError as exc:
        raise SpiderDataError(str(exc).replace("an imported copy", "an imported Spider copy")) from None


def run_spider_command(args: argparse.Namespace) -> int:
    if not args.path:
        return _status()
    path = Path(args.path).expanduser()
    unzipped: Path | None = None
    try:
        if path.is_file() and zipfile.is_zipfile(path):
            imported_spider_dir().parent.mkdir(parents=True, exist_ok=True)
            print(f"unpacking {path} ...")
            unzipped = _unzip(path, imported_spider_dir().parent)
            path = unzipped
        report = validate_spider_dir(path, check_gold=args.check_gold)
        print(report.summary())
        if not report.ok:
            print("error: this is not a usable Spider folder (see above)", file=sys.stderr)
            return 1
        if args.no_import:
            return 0
        if unzipped is not None:
            # The unpacked copy is the import: move it into place.
            target = imported_spider_dir()
            if target.is_symlink():
                target.unlink()
            elif target.exists():
                if not args.force:
                    raise SpiderDataError(f"{target} already holds an imported Spider copy; pass --force to replace it")
                shutil.rmtree(target)
            os.replace(report.root, target)
        else:
            target = import_spider(report.root, copy=args.copy, force=args.force)
        print(f"imported: {target} -> {report.root if unzipped is None else 'unpacked copy'}")
        print("lightning/Spider-v0 now uses it (data_dir= or $" + ENV_VAR + " still take precedence).")
        return 0
    except SpiderDataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if unzipped is not None:
            # Remove what is left of the unpacking folder (all of it when nothing was imported).
            top = unzipped
            while top.parent != imported_spider_dir().parent and top.parent != top:
                top = top.parent
            if top.name.startswith(".spider-unzip-"):
                shutil.rmtree(top, ignore_errors=True)
