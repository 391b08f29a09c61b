"""Load MuSiQue and HotpotQA (their official formats) or, when there is neither, the bundled sample.

A data folder holds question files whose name carries the split as a word (``dev``, ``train``,
``test``): MuSiQue's ``musique_ans_v1.0_dev.jsonl``, HotpotQA's ``hotpot_dev_distractor_v1.json``,
HippoRAG's ``hipporag_v1_musique_train.json``, IRCoT's ``ircot_hotpotqa_dev_subsampled.jsonl``.
A ``.json`` file holds a list of records, a ``.jsonl`` file one record a line. A file named
``<question file stem>_corpus.json`` beside it is that file's corpus (a list of ``{"title",
"text"}``, or HotpotQA's ``{title: [sentences]}``); every question's own paragraphs join the
corpus too, so each supporting paragraph is always retrievable.

Record formats, recognised per record:

* **MuSiQue**: ``id``, ``question``, ``answer``, ``answer_aliases``, ``paragraphs`` (``title``,
  ``paragraph_text``, ``is_supporting``), ``question_decomposition`` (sub-questions whose ``#k``
  stands for hop k's answer; each names its ``paragraph_support_idx``). Unanswerable questions
  (``answerable: false``, MuSiQue-full) are skipped and counted.
* **HotpotQA** (original): ``_id``, ``question``, ``answer``, ``context`` (``[title,
  [sentences]]``), ``supporting_facts`` (``[title, sentence index]``).
* **HotpotQA** (IRCoT): ``question_id``, ``question_text``, ``answers_objects`` (``spans``),
  ``contexts`` (``title``, ``paragraph_text``, ``is_supporting``).

Where the data is looked for, first match wins (``NAME`` is ``MUSIQUE`` or ``HOTPOTQA``):

1. ``data_dir=`` given to the loader / ``make_env`` (a folder or one question file);
2. the ``AGENTGYM_LIGHTNING_NAME_DIR`` environment variable;
3. ``<cache>/musique`` or ``<cache>/hotpotqa``, where ``agentgym-lightning data musique PATH``
   imports a download (``<cache>``: see :func:`agentgym_lightning.paths.cache_root`);
4. the bundled sample (:mod:`.sample`), built into ``<cache>`` on first use, announced with one
   warning per process that says how to point the env at real data.

An explicit location (1, 2 or an import) that holds no usable data is an error, never a silent
fallback to the sample.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym_lightning.paths import cache_root

from .sample import ensure_sample

__all__ = [
    "DATASETS",
    "SPLITS",
    "RagDataError",
    "RagDataWarning",
    "Passage",
    "SubQuestion",
    "RagExample",
    "RagDataset",
    "passage_id",
    "env_var",
    "imported_dir",
    "resolve_data_path",
    "find_question_files",
    "load_rag_dataset",
    "load_musique",
    "load_hotpotqa",
]

#: The data sets, by the name used in env vars, the cache and ``agentgym-lightning data``.
DATASETS: dict[str, str] = {"musique": "MuSiQue", "hotpotqa": "HotpotQA"}
SPLITS: tuple[str, ...] = ("dev", "train", "test")


class RagDataError(ValueError):
    """The data asked for is missing or malformed (the message says what to do)."""


class RagDataWarning(UserWarning):
    """The bundled sample is used instead of real data, or questions were skipped."""


def passage_id(title: str, text: str) -> str:
    """A passage's id: a hash of its title and text (the same passage gets the same id anywhere)."""
    return hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Passage:
    """One retrievable paragraph."""

    id: str
    title: str
    text: str

    @classmethod
    def make(cls, title: str, text: str) -> Passage:
        return cls(passage_id(title, text), title, text)


@dataclass(frozen=True)
class SubQuestion:
    """One hop of a question's gold decomposition (MuSiQue), ``#k`` already filled in."""

    question: str
    answer: str
    #: The id of the passage that answers it, if the data says.
    supporting_id: str | None = None


@dataclass(frozen=True)
class RagExample:
    """One question: what the env hands to the agent as its task (see :meth:`to_task`)."""

    id: str
    dataset: str
    split: str
    question: str
    #: Every accepted answer: the answer first, then its aliases.
    answers: tuple[str, ...]
    #: Ids of the passages the data marks as supporting (empty when it marks none).
    supporting_ids: tuple[str, ...] = ()
    #: The gold decomposition, when the data has one (MuSiQue).
    sub_questions: tuple[SubQuestion, ...] = ()
    #: ``2hop``/``3hop1``... (MuSiQue) or ``bridge``/``comparison`` (HotpotQA), when known.
    kind: str | None = None

    def to_task(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "dataset": self.dataset,
            "split": self.split,
            "question": self.question,
            "answers": list(self.answers),
            "supporting_ids": list(self.supporting_ids),
            "sub_questions": [
                {"question": s.question, "answer": s.answer, "supporting_id": s.supporting_id}
                for s in self.sub_questions
            ],
            "kind": self.kind,
        }


@dataclass
class RagDataset:
    """The questions of one split and the corpus they are answered from."""

    dataset: str
    split: str
    #: The question files read.
    files: list[Path]
    examples: list[RagExample]
    corpus: list[Passage]
    #: Where the data came from: ``argument``, ``env``, ``cache`` or ``sample``.
    source: str = "argument"
    #: Questions skipped (unanswerable ones), with why.
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def is_sample(self) -> bool:
        return self.source == "sample"

    def tasks(self) -> list[dict[str, Any]]:
        return [e.to_task() for e in self.examples]

    def __len__(self) -> int:
        return len(self.examples)


# --------------------------------------------------------------------------- where


def env_var(dataset: str) -> str:
    """The environment variable that points at ``dataset``'s folder."""
    return f"AGENTGYM_LIGHTNING_{_check_name(dataset).upper()}_DIR"


def imported_dir(dataset: str) -> Path:
    """Where ``agentgym-lightning data <dataset> PATH`` puts (a link to) a download."""
    return cache_root() / _check_name(dataset)


def _check_name(dataset: str) -> str:
    if dataset not in DATASETS:
        raise ValueError(f"unknown data set {dataset!r}; choose one of {', '.join(DATASETS)}")
    return dataset


def how_to_point(dataset: str) -> str:
    return (
        f"point it at real {DATASETS[dataset]} with `agentgym-lightning data {dataset} PATH`, the "
        f"{env_var(dataset)} environment variable, or make_env(data_dir=PATH)"
    )


_SPLIT_WORD = {s: re.compile(rf"(^|[^a-z]){s}([^a-z]|$)") for s in SPLITS}


def _is_question_file(path: Path) -> bool:
    name = path.name.lower()
    return path.is_file() and name.endswith((".json", ".jsonl")) and "corpus" not in name


def find_question_files(root: Path, split: str | None) -> tuple[str, list[Path]]:
    """``(split, files)``: the question files of ``split`` in folder ``root``.

    ``split=None`` picks ``dev`` when there is one, else the only split present.
    """
    candidates = sorted(p for p in root.iterdir() if _is_question_file(p))
    by_split = {s: [p for p in candidates if _SPLIT_WORD[s].search(p.name.lower())] for s in SPLITS}
    present = [s for s in SPLITS if by_split[s]]
    if split is None:
        if not present:
            raise RagDataError(
                f"{root} has no question file: expected .json/.jsonl files with dev, train or test in their "
                "name (e.g. musique_ans_v1.0_dev.jsonl, hotpot_dev_distractor_v1.json)"
            )
        split = "dev" if "dev" in present else present[0]
        if split != "dev" and len(present) > 1:
            raise RagDataError(f"{root} has splits {', '.join(present)} but no dev: pass split= to pick one")
    elif split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    if not by_split[split]:
        raise RagDataError(
            f"{root} has no {split} question file (found splits: {', '.join(present) or 'none'}); "
            f"pass split= one of them"
        )
    return split, by_split[split]


def _check_location(path: Path, origin: str) -> Path:
    path = path.expanduser()
    if not path.exists():
        raise RagDataError(f"{origin} {path} does not exist")
    return path


def resolve_data_path(
    dataset: str, data_dir: str | os.PathLike[str] | None = None, *, allow_sample: bool = True
) -> tuple[Path, str]:
    """``(folder or file, source)`` of ``dataset``'s data, following the search order above."""
    _check_name(dataset)
    if data_dir is not None:
        return _check_location(Path(data_dir), "data_dir"), "argument"
    env = os.environ.get(env_var(dataset))
    if env:
        return _check_location(Path(env), f"${env_var(dataset)} ="), "env"
    imported = imported_dir(dataset)
    if imported.exists() or imported.is_symlink():
        try:
            return _check_location(imported, f"the imported {DATASETS[dataset]} folder"), "cache"
        except RagDataError as exc:
            raise RagDataError(f"{exc}; run `agentgym-lightning data {dataset} PATH` again") from None
    if not allow_sample:
        raise RagDataError(f"no {DATASETS[dataset]} data found; {how_to_point(dataset)}")
    root = ensure_sample(cache_root()) / dataset
    _notice_sample(dataset, root)
    return root, "sample"


_noticed: set[str] = set()
_notice_lock = threading.Lock()


def _notice_sample(dataset: str, root: Path) -> None:
    with _notice_lock:
        if dataset in _noticed:
            return
        _noticed.add(dataset)
    warnings.warn(
        f"No {DATASETS[dataset]} data found: the env uses the bundled 12-question sample ({root}), not "
        f"{DATASETS[dataset]}; {how_to_point(dataset)}.",
        RagDataWarning,
        stacklevel=4,
    )


# --------------------------------------------------------------------------- reading


def _read_records(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".jsonl":
            items = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            items = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RagDataError(f"{path} is not valid JSON: {exc}") from None
    if isinstance(items, dict) and isinstance(items.get("data"), list):
        items = items["data"]
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise RagDataError(f"{path} must hold a list of question objects (.json) or one object a line (.jsonl)")
    return items


def _read_corpus(path: Path) -> list[Passage]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise RagDataError(f"corpus {path} is not valid JSON: {exc}") from None
    if isinstance(data, Mapping):  # HotpotQA: {title: [sentences]} or {title: text}
        return [Passage.make(str(t), _join_sentences(s)) for t, s in data.items()]
    if isinstance(data, list):
        out = []
        for i, item in enumerate(data):
            if not isinstance(item, Mapping) or not isinstance(item.get("title"), str):
                raise RagDataError(f"corpus {path}[{i}] must be an object with a title and a text")
            text = item.get("text", item.get("paragraph_text"))
            if not isinstance(text, str):
                raise RagDataError(f"corpus {path}[{i}] has no string text")
            out.append(Passage.make(item["title"], text))
        return out
    raise RagDataError(f"corpus {path} must be a list of {{title, text}} objects or a {{title: sentences}} object")


def _join_sentences(sentences: Any) -> str:
    if isinstance(sentences, str):
        return sentences
    # HotpotQA sentences carry their own leading spaces (" In it, ..."): concatenate them.
    return "".join(str(s) for s in sentences).strip()


def _where(path: Path, i: int) -> str:
    return f"{path}[{i}]"


def _require(item: Mapping[str, Any], keys: Sequence[str], where: str) -> None:
    missing = [k for k in keys if k not in item]
    if missing:
        raise RagDataError(f"{where} lacks {', '.join(missing)}")


_HOP_REF = re.compile(r"#(\d+)")


def _parse_musique(item: Mapping[str, Any], where: str, split: str) -> tuple[RagExample, list[Passage]]:
    _require(item, ("id", "question", "answer", "paragraphs"), where)
    passages = []
    supporting = []
    for p in item["paragraphs"]:
        passage = Passage.make(str(p["title"]), str(p["paragraph_text"]))
        passages.append(passage)
        if p.get("is_supporting"):
            supporting.append(passage.id)
    hops: list[SubQuestion] = []
    for step in item.get("question_decomposition") or []:
        # "#2" is the answer of hop 2: filled in, as a searcher that solved hop 2 would ask it.
        question = _HOP_REF.sub(
            lambda m: hops[int(m.group(1)) - 1].answer if 0 < int(m.group(1)) <= len(hops) else m.group(0),
            str(step["question"]),
        )
        idx = step.get("paragraph_support_idx")
        support = passages[idx].id if isinstance(idx, int) and 0 <= idx < len(passages) else None
        hops.append(SubQuestion(question=question, answer=str(step.get("answer", "")), supporting_id=support))
    answers = [str(item["answer"]), *[str(a) for a in item.get("answer_aliases") or []]]
    qid = str(item["id"])
    example = RagExample(
        id=qid,
        dataset="musique",
        split=split,
        question=str(item["question"]),
        answers=tuple(dict.fromkeys(answers)),
        supporting_ids=tuple(dict.fromkeys(supporting)),
        sub_questions=tuple(hops),
        kind=qid.split("__")[0] if "__" in qid else None,
    )
    return example, passages


def _parse_hotpotqa(item: Mapping[str, Any], where: str, split: str) -> tuple[RagExample, list[Passage]]:
    if "question_text" in item:  # IRCoT's format
        _require(item, ("question_id", "answers_objects", "contexts"), where)
        passages, supporting = [], []
        for c in item["contexts"]:
            passage = Passage.make(str(c["title"]), str(c["paragraph_text"]))
            passages.append(passage)
            if c.get("is_supporting"):
                supporting.append(passage.id)
        answers = [str(s) for obj in item["answers_objects"] for s in obj.get("spans") or []]
        if not answers:
            raise RagDataError(f"{where} has no answer span")
        example = RagExample(
            id=str(item["question_id"]), dataset="hotpotqa", split=split, question=str(item["question_text"]),
            answers=tuple(dict.fromkeys(answers)), supporting_ids=tuple(dict.fromkeys(supporting)),
        )
        return example, passages
    _require(item, ("_id", "question", "answer", "context"), where)
    support_titles = {str(f[0]) for f in item.get("supporting_facts") or []}
    passages, supporting = [], []
    for title, sentences in item["context"]:
        passage = Passage.make(str(title), _join_sentences(sentences))
        passages.append(passage)
        if title in support_titles:
            supporting.append(passage.id)
    example = RagExample(
        id=str(item["_id"]), dataset="hotpotqa", split=split, question=str(item["question"]),
        answers=(str(item["answer"]),), supporting_ids=tuple(dict.fromkeys(supporting)),
        kind=str(item["type"]) if item.get("type") else None,
    )
    return example, passages


_PARSERS = {"musique": _parse_musique, "hotpotqa": _parse_hotpotqa}


def _load_files(dataset: str, split: str, files: Iterable[Path], source: str) -> RagDataset:
    files = list(files)
    examples: list[RagExample] = []
    corpus: dict[str, Passage] = {}
    skipped: dict[str, int] = {}
    parse = _PARSERS[dataset]
    for path in files:
        corpus_file = path.with_name(f"{path.stem}_corpus.json")
        if corpus_file.is_file():
            for p in _read_corpus(corpus_file):
                corpus.setdefault(p.id, p)
        for i, item in enumerate(_read_records(path)):
            if item.get("answerable") is False:
                skipped["unanswerable"] = skipped.get("unanswerable", 0) + 1
                continue
            try:
                example, passages = parse(item, _where(path, i), split)
            except (KeyError, TypeError, IndexError, ValueError) as exc:
                if isinstance(exc, RagDataError):
                    raise
                raise RagDataError(
                    f"{_where(path, i)} is not a {DATASETS[dataset]} record ({type(exc).__name__}: {exc})"
                ) from None
            examples.append(example)
            for p in passages:
                corpus.setdefault(p.id, p)
    if not examples:
        raise RagDataError(f"no usable {DATASETS[dataset]} question in {', '.join(map(str, files))}")
    if skipped:
        warnings.warn(
            f"{DATASETS[dataset]} {split}: skipped {sum(skipped.values())} unanswerable questions",
            RagDataWarning,
            stacklevel=3,
        )
    return RagDataset(dataset=dataset, split=split, files=files, examples=examples, corpus=list(corpus.values()),
                      source=source, skipped=skipped)


_cache_lock = threading.Lock()
_cache: dict[tuple[str, str, tuple[str, ...], str], RagDataset] = {}


def load_rag_dataset(
    dataset: str,
    split: str | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    allow_sample: bool = True,
) -> RagDataset:
    """The questions of ``split`` of ``dataset`` (``"musique"`` or ``"hotpotqa"``) and their corpus.

    ``split=None`` takes ``dev`` when present, else the only split there is. ``data_dir`` may be
    a folder or one question file. Loads are cached per file set.
    """
    path, source = resolve_data_path(dataset, data_dir, allow_sample=allow_sample)
    if path.is_file():
        files = [path]
        if split is None:
            split = next((s for s in SPLITS if _SPLIT_WORD[s].search(path.name.lower())), "dev")
        elif split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    else:
        if (path / dataset).is_dir() and not any(_is_question_file(p) for p in path.iterdir()):
            path = path / dataset  # a folder of data sets, like ../shared/data
        split, files = find_question_files(path, split)
    key = (dataset, split, tuple(str(f.resolve()) for f in files), source)
    with _cache_lock:
        found = _cache.get(key)
    if found is None:
        found = _load_files(dataset, split, files, source)
        with _cache_lock:
            _cache[key] = found
    return found


def load_musique(split: str | None = None, data_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> RagDataset:
    """MuSiQue (see :func:`load_rag_dataset`)."""
    return load_rag_dataset("musique", split, data_dir, **kwargs)


def load_hotpotqa(split: str | None = None, data_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> RagDataset:
    """HotpotQA (see :func:`load_rag_dataset`)."""
    return load_rag_dataset("hotpotqa", split, data_dir, **kwargs)
