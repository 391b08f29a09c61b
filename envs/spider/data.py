"""Load Spider (official layout) or, when there is none, the bundled sample.

The official layout, as in Spider's release zip::

    ROOT/dev.json                 # [{"db_id", "question", "query", ...}, ...]
    ROOT/train_spider.json        # (+ train_others.json, loaded too when present)
    ROOT/tables.json
    ROOT/database/<db_id>/<db_id>.sqlite

Where the data is looked for, first match wins:

1. ``data_dir=`` given to :func:`load_spider` / ``make_env`` (an error if it is not Spider);
2. the ``AGENTGYM_LIGHTNING_SPIDER_DIR`` environment variable (an error if it is not Spider);
3. ``<cache>/spider`` where ``agentgym-lightning data spider PATH`` imports a download
   (``<cache>`` is ``$AGENTGYM_LIGHTNING_CACHE``, else ``$XDG_CACHE_HOME/agentgym-lightning``,
   else ``~/.cache/agentgym-lightning``);
4. the bundled sample (:mod:`.sample`), built into ``<cache>`` on first use, with one warning
   that says how to point the env at real Spider.

Questions whose database file is missing (Spider's public release lacks a few) are skipped and
counted, with one warning per loaded split.
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym_lightning.paths import CACHE_ENV_VAR, cache_root

from .sample import ensure_sample

__all__ = [
    "ENV_VAR",
    "CACHE_ENV_VAR",
    "SPLITS",
    "SpiderDataError",
    "SpiderDataWarning",
    "SpiderExample",
    "SpiderDataset",
    "ValidationReport",
    "cache_root",
    "imported_spider_dir",
    "resolve_spider_dir",
    "load_spider",
    "validate_spider_dir",
    "db_path",
]

ENV_VAR = "AGENTGYM_LIGHTNING_SPIDER_DIR"
#: Split name -> the question files that make it up (the first must exist).
SPLIT_FILES: dict[str, tuple[str, ...]] = {
    "dev": ("dev.json",),
    "train": ("train_spider.json", "train_others.json"),
    "test": ("test.json",),  # the 2023 public test release (its databases are in test_database/)
}
SPLITS: tuple[str, ...] = tuple(SPLIT_FILES)

_HOW_TO_POINT = (
    "point it at real Spider with `agentgym-lightning data spider PATH` (PATH: the unzipped spider/ folder "
    f"or spider.zip), the {ENV_VAR} environment variable, or make_env(data_dir=PATH)"
)


class SpiderDataError(ValueError):
    """The Spider data asked for is missing or malformed (the message says what to do)."""


class SpiderDataWarning(UserWarning):
    """Spider data was found incomplete, or the bundled sample is used instead."""


@dataclass(frozen=True)
class SpiderExample:
    """One question: what the env hands to the agent as its task (see :meth:`to_task`)."""

    id: str
    split: str
    db_id: str
    question: str
    query: str
    db_path: str

    def to_task(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "split": self.split,
            "db_id": self.db_id,
            "question": self.question,
            "query": self.query,
            "db_path": self.db_path,
        }


@dataclass
class SpiderDataset:
    """The usable questions of one split, and what was skipped."""

    split: str
    root: Path
    examples: list[SpiderExample]
    #: Questions skipped because their database file is missing, by db_id.
    skipped: Counter[str] = field(default_factory=Counter)
    #: Where the data came from: ``argument``, ``env``, ``cache`` or ``sample``.
    source: str = "argument"

    @property
    def is_sample(self) -> bool:
        return self.source == "sample"

    @property
    def num_skipped(self) -> int:
        return sum(self.skipped.values())

    def tasks(self) -> list[dict[str, Any]]:
        return [e.to_task() for e in self.examples]

    def __len__(self) -> int:
        return len(self.examples)


def imported_spider_dir() -> Path:
    """Where ``agentgym-lightning data spider PATH`` puts (a link to) a Spider download."""
    return cache_root() / "spider"


def _database_dir(root: Path, split: str) -> Path:
    if split == "test" and (root / "test_database").is_dir():
        return root / "test_database"
    return root / "database"


def db_path(root: str | Path, db_id: str, split: str = "dev") -> Path:
    """The SQLite file of a database in the official layout."""
    return _database_dir(Path(root), split) / db_id / f"{db_id}.sqlite"


def _looks_like_spider(root: Path) -> bool:
    return (root / "dev.json").is_file() or (root / "train_spider.json").is_file()


def _check_spider_dir(root: Path, origin: str) -> Path:
    root = root.expanduser()
    if not root.exists():
        raise SpiderDataError(f"{origin} {root} does not exist; {_HOW_TO_POINT}")
    if not _looks_like_spider(root) and (root / "spider").is_dir() and _looks_like_spider(root / "spider"):
        root = root / "spider"  # the folder the zip unpacks into
    if not _looks_like_spider(root):
        raise SpiderDataError(
            f"{origin} {root} is not a Spider folder: it has neither dev.json nor train_spider.json "
            "(expected dev.json, train_spider.json, tables.json and database/<db_id>/<db_id>.sqlite)"
        )
    if not (root / "database").is_dir():
        raise SpiderDataError(f"{origin} {root} has no database/ folder (database/<db_id>/<db_id>.sqlite)")
    return root


_sample_notice_lock = threading.Lock()
_sample_noticed = False


def _notice_sample(root: Path) -> None:
    global _sample_noticed
    with _sample_notice_lock:
        if _sample_noticed:
            return
        _sample_noticed = True
    warnings.warn(
        f"No Spider data found: lightning/Spider-v0 uses the bundled 44-question sample ({root}), "
        f"not Spider; {_HOW_TO_POINT}.",
        SpiderDataWarning,
        stacklevel=4,
    )


def resolve_spider_dir(data_dir: str | os.PathLike[str] | None = None, *, allow_sample: bool = True) -> tuple[Path, str]:
    """``(root, source)`` of the Spider data to use, following the search order above."""
    if data_dir is not None:
        return _check_spider_dir(Path(data_dir), "data_dir"), "argument"
    env = os.environ.get(ENV_VAR)
    if env:
        return _check_spider_dir(Path(env), f"${ENV_VAR} ="), "env"
    imported = imported_spider_dir()
    if imported.exists():
        try:
            return _check_spider_dir(imported, "the imported Spider folder"), "cache"
        except SpiderDataError as exc:
            raise SpiderDataError(f"{exc}; run `agentgym-lightning data spider PATH` again") from None
    if not allow_sample:
        raise SpiderDataError(f"no Spider data found; {_HOW_TO_POINT}")
    root = ensure_sample(cache_root())
    _notice_sample(root)
    return root, "sample"


def _read_questions(path: Path) -> list[dict[str, Any]]:
    try:
        items = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SpiderDataError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(items, list):
        raise SpiderDataError(f"{path} must hold a JSON list of questions")
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not all(isinstance(item.get(k), str) for k in ("db_id", "question", "query")):
            raise SpiderDataError(f"{path}[{i}] must be an object with string db_id, question and query")
    return items


_cache_lock = threading.Lock()
_cache: dict[tuple[str, str, str], SpiderDataset] = {}


def _load(root: Path, split: str, source: str) -> SpiderDataset:
    files = SPLIT_FILES[split]
    if not (root / files[0]).is_file():
        raise SpiderDataError(f"split {split!r} needs {root / files[0]}, which does not exist")
    examples: list[SpiderExample] = []
    skipped: Counter[str] = Counter()
    index = 0
    for name in files:
        path = root / name
        if not path.is_file():
            continue
        for item in _read_questions(path):
            i, index = index, index + 1
            file = db_path(root, item["db_id"], split)
            if not file.is_file():
                skipped[item["db_id"]] += 1
                continue
            examples.append(
                SpiderExample(
                    id=f"{split}-{i}",
                    split=split,
                    db_id=item["db_id"],
                    question=item["question"],
                    query=item["query"],
                    db_path=str(file),
                )
            )
    if skipped:
        missing = ", ".join(f"{db} ({n})" for db, n in sorted(skipped.items()))
        warnings.warn(
            f"Spider {split}: skipped {sum(skipped.values())} of {index} questions whose database file is "
            f"missing under {_database_dir(root, split)}: {missing}",
            SpiderDataWarning,
            stacklevel=3,
        )
    return SpiderDataset(split=split, root=root, examples=examples, skipped=skipped, source=source)


def load_spider(
    split: str = "dev", data_dir: str | os.PathLike[str] | None = None, *, allow_sample: bool = True
) -> SpiderDataset:
    """The usable questions of ``split`` (``dev``, ``train``; ``test`` for the 2023 release).

    Task ids are ``"<split>-<position in the file>"`` (skipped questions keep their numbers, so
    ids match the official files). Loads are cached per folder and split.
    """
    if split not in SPLIT_FILES:
        raise ValueError(f"unknown Spider split {split!r}; choose one of {', '.join(SPLITS)}")
    root, source = resolve_spider_dir(data_dir, allow_sample=allow_sample)
    key = (str(root.resolve()), split, source)
    with _cache_lock:
        found = _cache.get(key)
    if found is None:
        found = _load(root, split, source)
        with _cache_lock:
            _cache[key] = found
    return found


# --------------------------------------------------------------------------- validation


@dataclass
class ValidationReport:
    """What :func:`validate_spider_dir` found. ``ok`` is False when the folder is unusable."""

    root: Path
    splits: dict[str, tuple[int, int]] = field(default_factory=dict)  #: split -> (usable, total)
    missing_databases: dict[str, list[str]] = field(default_factory=dict)  #: split -> db_ids
    databases: int = 0
    unreadable_databases: list[str] = field(default_factory=list)
    tables_json_databases: int | None = None
    gold_checked: int = 0
    gold_failures: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors and not self.unreadable_databases and any(u for u, _ in self.splits.values())

    def summary(self) -> str:
        lines = [f"Spider at {self.root}"]
        for split, (usable, total) in self.splits.items():
            missing = self.missing_databases.get(split) or []
            extra = f" (missing databases: {', '.join(missing)})" if missing else ""
            lines.append(f"  {split}: {usable} usable of {total} questions{extra}")
        lines.append(f"  databases: {self.databases} SQLite files")
        if self.tables_json_databases is not None:
            lines.append(f"  tables.json: {self.tables_json_databases} schemas")
        if self.unreadable_databases:
            lines.append(f"  unreadable databases: {', '.join(self.unreadable_databases)}")
        if self.gold_checked:
            lines.append(f"  gold queries run: {self.gold_checked}, failed: {len(self.gold_failures)}")
            lines.extend(f"    {f}" for f in self.gold_failures[:20])
        lines.extend(f"  error: {e}" for e in self.errors)
        return "\n".join(lines)


def validate_spider_dir(root: str | os.PathLike[str], *, check_gold: bool = False) -> ValidationReport:
    """Check a Spider folder: question files parse, databases open read-only (and, with
    ``check_gold``, every usable gold query runs)."""
    import sqlite3

    from .sandbox import SandboxLimits, SQLSandbox

    report = ValidationReport(root=Path(root))
    try:
        resolved = _check_spider_dir(Path(root), "")
    except SpiderDataError as exc:
        report.errors.append(str(exc).strip())
        return report
    report.root = resolved
    db_root = resolved / "database"
    files = sorted(db_root.glob("*/*.sqlite"))
    report.databases = len(files)
    for f in files:
        try:
            conn = sqlite3.connect(f.resolve().as_uri() + "?mode=ro&immutable=1", uri=True)
            try:
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            finally:
                conn.close()
        except sqlite3.DatabaseError as exc:
            report.unreadable_databases.append(f"{f.parent.name} ({exc})")
    if (resolved / "tables.json").is_file():
        try:
            report.tables_json_databases = len(json.loads((resolved / "tables.json").read_text(encoding="utf-8")))
        except (json.JSONDecodeError, TypeError) as exc:
            report.errors.append(f"tables.json is not valid JSON: {exc}")
    else:
        report.errors.append("tables.json is missing")
    sandbox = SQLSandbox(SandboxLimits(timeout_s=30.0)) if check_gold else None
    for split, names in SPLIT_FILES.items():
        if not (resolved / names[0]).is_file():
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", SpiderDataWarning)
                data = _load(resolved, split, "argument")
        except SpiderDataError as exc:
            report.errors.append(str(exc))
            continue
        report.splits[split] = (len(data), len(data) + data.num_skipped)
        if data.skipped:
            report.missing_databases[split] = sorted(data.skipped)
        if sandbox is not None:
            from .sqltext import replace_cur_year

            for ex in data.examples:
                result = sandbox.run(ex.db_path, replace_cur_year(ex.query))
                report.gold_checked += 1
                if not result.ok:
                    report.gold_failures.append(f"{ex.id} [{ex.db_id}] {result.error}: {result.message}")
    if sandbox is not None:
        sandbox.close()
    if not report.splits:
        report.errors.append("no split could be loaded")
    return report
