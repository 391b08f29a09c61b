"""Load GSM8K and Calc-X (JSON Lines) or, when there is none, the bundled samples.

The layouts, as released::

    GSM8K:   ROOT/test.jsonl, ROOT/train.jsonl (also test_socratic.jsonl ...)
             {"question": ..., "answer": "... <<48/2=24>> ...\\n#### 72"}
    Calc-X:  ROOT/<split>.jsonl (train, validation, test; agent-lightning's sample.jsonl)
             {"id": ..., "question": ..., "chain": ..., "result": "2/3", "source": ...}

A split is the file ``<split>.jsonl`` of the folder; ``data_dir`` may also name one ``.jsonl``
file, which is then the split whatever it is called. Where the data is looked for, first match
wins:

1. ``data_dir=`` given to the loader / ``make_env`` (an error if it holds no such split);
2. the environment variable (``AGENTGYM_LIGHTNING_GSM8K_DIR``, ``AGENTGYM_LIGHTNING_CALCX_DIR``);
3. ``<cache>/gsm8k`` or ``<cache>/calcx``, where ``agentgym-lightning data gsm8k PATH`` (``calcx``)
   imports a download (``<cache>``: see :func:`agentgym_lightning.paths.cache_root`);
4. the bundled sample (:mod:`.sample`), with one warning per data set that says how to point the
   env at real data.

Records whose gold answer cannot be read (see :mod:`.answers`) are skipped and counted, with one
warning per loaded split; a line that is not a JSON object with the needed fields is an error
that names the file and line.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym_lightning.envs.jsonl import jsonl_records
from agentgym_lightning.paths import cache_root

from .answers import gsm8k_gold, parse_answer
from .sample import calcx_sample, gsm8k_sample

__all__ = [
    "DATASETS",
    "MathDataError",
    "MathDataWarning",
    "MathDataset",
    "DatasetSpec",
    "resolve_data",
    "load_math",
    "load_gsm8k",
    "load_calcx",
    "available_splits",
]


class MathDataError(ValueError):
    """The data asked for is missing or malformed (the message says what to do)."""


class MathDataWarning(UserWarning):
    """Records were skipped, or the bundled sample is used instead of real data."""


@dataclass(frozen=True)
class DatasetSpec:
    """How one data set is found and read."""

    name: str  #: ``gsm8k`` or ``calcx``: the cache folder and the ``data`` subcommand
    title: str  #: how messages name it
    env_var: str
    env_id: str
    #: Fields every record must have.
    required: tuple[str, ...]
    #: ``record -> gold answer text`` (raises ``ValueError`` when there is none).
    gold: Callable[[dict[str, Any]], str]
    #: ``split -> records`` of the bundled sample.
    sample: Callable[[str], list[dict[str, Any]]]
    sample_splits: tuple[str, ...] = ("test", "train")

    def how_to_point(self) -> str:
        return (
            f"point it at real {self.title} with `agentgym-lightning data {self.name} PATH` (PATH: the folder "
            f"with <split>.jsonl files), the {self.env_var} environment variable, or make_env(data_dir=PATH)"
        )


def _calcx_gold(record: dict[str, Any]) -> str:
    return str(record["result"])


DATASETS: dict[str, DatasetSpec] = {
    "gsm8k": DatasetSpec(
        name="gsm8k",
        title="GSM8K",
        env_var="AGENTGYM_LIGHTNING_GSM8K_DIR",
        env_id="lightning/GSM8K-v0",
        required=("question", "answer"),
        gold=lambda record: gsm8k_gold(str(record["answer"])),
        sample=gsm8k_sample,
    ),
    "calcx": DatasetSpec(
        name="calcx",
        title="Calc-X",
        env_var="AGENTGYM_LIGHTNING_CALCX_DIR",
        env_id="lightning/CalcX-v0",
        required=("question", "result"),
        gold=_calcx_gold,
        sample=calcx_sample,
    ),
}


@dataclass
class MathDataset:
    """The usable tasks of one split, and what was skipped."""

    name: str
    split: str
    #: The folder or file read (``None`` for the bundled sample).
    path: Path | None
    tasks_: list[dict[str, Any]]
    #: Where the data came from: ``argument``, ``env``, ``cache`` or ``sample``.
    source: str = "argument"
    #: ``(line number, why)`` of each record skipped because its gold answer cannot be read.
    skipped: list[tuple[int, str]] = field(default_factory=list)

    @property
    def is_sample(self) -> bool:
        return self.source == "sample"

    def tasks(self) -> list[dict[str, Any]]:
        """Fresh copies of the tasks (``id``, ``split``, ``question``, ``answer``, and the record's
        own fields: ``solution`` for GSM8K; ``chain``, ``source`` for Calc-X)."""
        return [dict(t) for t in self.tasks_]

    def __len__(self) -> int:
        return len(self.tasks_)


def _spec(name: str) -> DatasetSpec:
    if name not in DATASETS:
        raise ValueError(f"unknown math data set {name!r}; choose one of {', '.join(DATASETS)}")
    return DATASETS[name]


def available_splits(path: Path) -> list[str]:
    """The splits of a folder (its ``*.jsonl`` files), or the one split of a file."""
    if path.is_file():
        return [path.stem]
    return sorted(p.stem for p in path.glob("*.jsonl"))


def _check_path(spec: DatasetSpec, path: Path, origin: str) -> Path:
    path = path.expanduser()
    if not path.exists():
        raise MathDataError(f"{origin} {path} does not exist; {spec.how_to_point()}")
    if path.is_file():
        if path.suffix != ".jsonl":
            raise MathDataError(f"{origin} {path} is not a .jsonl file")
        return path
    if not available_splits(path):
        raise MathDataError(f"{origin} {path} holds no .jsonl files; {spec.title} comes as <split>.jsonl files")
    return path


_notice_lock = threading.Lock()
_noticed: set[str] = set()


def _notice_sample(spec: DatasetSpec) -> None:
    with _notice_lock:
        if spec.name in _noticed:
            return
        _noticed.add(spec.name)
    warnings.warn(
        f"No {spec.title} data found: {spec.env_id} uses the bundled sample "
        f"({sum(len(spec.sample(s)) for s in spec.sample_splits)} problems written for this project), "
        f"not {spec.title}; {spec.how_to_point()}.",
        MathDataWarning,
        stacklevel=4,
    )


def resolve_data(name: str, data_dir: str | os.PathLike[str] | None = None, *, allow_sample: bool = True) -> tuple[Path | None, str]:
    """``(path, source)`` of the data set to use, following the search order above
    (``(None, "sample")`` for the bundled sample)."""
    spec = _spec(name)
    if data_dir is not None:
        return _check_path(spec, Path(data_dir), "data_dir"), "argument"
    env = os.environ.get(spec.env_var)
    if env:
        return _check_path(spec, Path(env), f"${spec.env_var} ="), "env"
    imported = cache_root() / spec.name
    if imported.exists() or imported.is_symlink():
        try:
            return _check_path(spec, imported, f"the imported {spec.title} data"), "cache"
        except MathDataError as exc:
            raise MathDataError(f"{exc}; run `agentgym-lightning data {spec.name} PATH` again") from None
    if not allow_sample:
        raise MathDataError(f"no {spec.title} data found; {spec.how_to_point()}")
    _notice_sample(spec)
    return None, "sample"


def _read_jsonl(spec: DatasetSpec, path: Path) -> list[tuple[int, dict[str, Any]]]:
    records = []
    for number, record in jsonl_records(path, MathDataError):
        if not isinstance(record, dict) or any(k not in record for k in spec.required):
            raise MathDataError(f"{path}:{number} must be a JSON object with {', '.join(spec.required)}")
        records.append((number, record))
    return records


def _to_tasks(
    spec: DatasetSpec, split: str, records: list[tuple[int, dict[str, Any]]]
) -> tuple[list[dict[str, Any]], list[tuple[int, str]]]:
    tasks, skipped = [], []
    for index, (number, record) in enumerate(records):
        try:
            gold = spec.gold(record)
            if parse_answer(gold) is None:
                raise ValueError(f"gold answer {gold!r} is not a number or an option letter")
        except ValueError as exc:
            skipped.append((number, str(exc)))
            continue
        task = {k: v for k, v in record.items() if k not in ("answer", "result")}
        if spec.name == "gsm8k":
            task["solution"] = record["answer"]
        else:
            task["result"] = record["result"]
        task_id = str(record.get("id") or f"{spec.name}-{split}-{index}")
        task.update(id=task_id, split=split, question=str(record["question"]), answer=gold)
        tasks.append(task)
    return tasks, skipped


_cache_lock = threading.Lock()
_cache: dict[tuple[str, str, str, str], MathDataset] = {}


def _load(spec: DatasetSpec, split: str, path: Path | None, source: str) -> MathDataset:
    if path is None:
        if split not in spec.sample_splits:
            raise MathDataError(f"the bundled {spec.title} sample has splits {', '.join(spec.sample_splits)}, not {split!r}")
        numbered = list(enumerate(spec.sample(split), start=1))
        tasks, skipped = _to_tasks(spec, split, numbered)
        return MathDataset(spec.name, split, None, tasks, source, skipped)
    file = path if path.is_file() else path / f"{split}.jsonl"
    if not file.is_file():
        raise MathDataError(
            f"{spec.title} split {split!r} needs {file}, which does not exist "
            f"(splits there: {', '.join(available_splits(path)) or 'none'})"
        )
    tasks, skipped = _to_tasks(spec, split if path.is_dir() else path.stem, _read_jsonl(spec, file))
    if skipped:
        lines = ", ".join(str(n) for n, _ in skipped[:10]) + (" ..." if len(skipped) > 10 else "")
        warnings.warn(
            f"{spec.title} {split}: skipped {len(skipped)} of {len(skipped) + len(tasks)} records whose gold answer "
            f"cannot be read (lines {lines}; first: {skipped[0][1]})",
            MathDataWarning,
            stacklevel=3,
        )
    return MathDataset(spec.name, split, file, tasks, source, skipped)


def load_math(
    name: str, split: str = "test", data_dir: str | os.PathLike[str] | None = None, *, allow_sample: bool = True
) -> MathDataset:
    """The usable tasks of ``split`` of data set ``name`` (``gsm8k`` or ``calcx``); cached per file.

    Task ids are the record's ``id`` when it has one (Calc-X), else ``"<name>-<split>-<position>"``
    (skipped records keep their numbers).
    """
    spec = _spec(name)
    path, source = resolve_data(name, data_dir, allow_sample=allow_sample)
    key = (spec.name, split, str(path.resolve()) if path is not None else "", source)
    with _cache_lock:
        found = _cache.get(key)
    if found is None:
        found = _load(spec, split, path, source)
        with _cache_lock:
            _cache[key] = found
    return found


def load_gsm8k(split: str = "test", data_dir: str | os.PathLike[str] | None = None, *, allow_sample: bool = True) -> MathDataset:
    """GSM8K's ``split`` (``test``: 1319 problems, ``train``: 7473); see :func:`load_math`."""
    return load_math("gsm8k", split, data_dir, allow_sample=allow_sample)


def load_calcx(split: str = "test", data_dir: str | os.PathLike[str] | None = None, *, allow_sample: bool = True) -> MathDataset:
    """Calc-X's ``split`` (``train``, ``validation``, ``test``); see :func:`load_math`."""
    return load_math("calcx", split, data_dir, allow_sample=allow_sample)
