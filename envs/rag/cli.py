"""``agentgym-lightning data musique [PATH]`` and ``data hotpotqa [PATH]``.

With PATH (a folder of question files, or one file; see :mod:`.data`) the command reads every
split it finds, prints what it holds and imports it: ``<cache>/<name>`` becomes a symbolic link
to it (``--copy`` copies instead), which is where the env looks when neither ``data_dir=`` nor
the environment variable is given. ``--index`` also builds the retrieval index of the default
split now (a progress bar) instead of on first use. Without PATH the command says which data
the env uses now.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from agentgym_lightning.paths import link_into_cache

from .data import (
    DATASETS,
    SPLITS,
    RagDataError,
    RagDataWarning,
    env_var,
    find_question_files,
    imported_dir,
    load_rag_dataset,
)
from .env import ENV_IDS

__all__ = ["register_data_commands", "run_data_command"]


def register_data_commands(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``musique`` and ``hotpotqa`` to the ``data`` command's subparsers."""
    for name, title in DATASETS.items():
        parser = subparsers.add_parser(
            name,
            help=f"validate a {title} download and import it for {ENV_IDS[name]}",
            description=(
                f"Validate a {title} download (a folder of .json/.jsonl question files with dev/train/test in "
                f"their names, optional <file>_corpus.json beside them; or one question file) and make "
                f"{ENV_IDS[name]} use it. Without PATH, show which data the env uses now."
            ),
        )
        parser.add_argument("path", nargs="?", help=f"the {title} folder or question file")
        parser.add_argument("--copy", action="store_true", help="copy into the cache instead of linking")
        parser.add_argument("--no-import", action="store_true", help="only validate; change nothing")
        parser.add_argument("--force", action="store_true", help="replace a previously imported copy")
        parser.add_argument("--index", action="store_true", help="also build the retrieval index now")
        parser.add_argument("--embedding-model", default=None, help="sentence-transformers model for --index")
        parser.set_defaults(func=run_data_command, dataset=name)


def _describe(dataset: str, path: Path | None) -> list[str]:
    """One line per split found: questions, passages, supporting paragraphs."""
    lines = []
    splits = [None] if path is not None and path.is_file() else []
    if path is not None and path.is_dir():
        for split in SPLITS:
            try:
                find_question_files(path, split)
                splits.append(split)
            except RagDataError:
                continue
    for split in splits or [None]:
        data = load_rag_dataset(dataset, split, path)
        marked = sum(1 for e in data.examples if e.supporting_ids)
        decomposed = sum(1 for e in data.examples if e.sub_questions)
        lines.append(
            f"  {data.split}: {len(data)} questions, {len(data.corpus)} passages; {marked} mark supporting "
            f"paragraphs, {decomposed} have a decomposition ({', '.join(f.name for f in data.files)})"
        )
    return lines


def run_data_command(args: argparse.Namespace) -> int:
    dataset, title = args.dataset, DATASETS[args.dataset]
    try:
        if not args.path:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RagDataWarning)
                data = load_rag_dataset(dataset)
            where = {"env": f"from ${env_var(dataset)}", "cache": f"imported ({imported_dir(dataset)})",
                     "sample": "the bundled sample (no data found)", "argument": "given"}[data.source]
            print(f"{ENV_IDS[dataset]} uses {', '.join(map(str, data.files))}: {where}; {data.split} has "
                  f"{len(data)} questions over {len(data.corpus)} passages")
            if data.is_sample:
                print(f"Import real {title} with: agentgym-lightning data {dataset} PATH")
            return 0
        path = Path(args.path).expanduser()
        print(f"{title} at {path}")
        for line in _describe(dataset, path):
            print(line)
        if not args.no_import:
            target = link_into_cache(path, imported_dir(dataset), copy=args.copy, force=args.force)
            print(f"imported: {target} -> {path.resolve()}")
            print(f"{ENV_IDS[dataset]} now uses it (data_dir= or ${env_var(dataset)} still take precedence).")
        if args.index:
            from .retriever import get_retriever

            data = load_rag_dataset(dataset, None, path)
            retriever = get_retriever(data.corpus, args.embedding_model)
            state = "built" if retriever.index.built else "already cached"
            print(f"index of {len(data.corpus)} passages {state}: {retriever.index.path}")
        return 0
    except (RagDataError, FileExistsError, FileNotFoundError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
