"""``agentgym-lightning data gsm8k [PATH]`` and ``data calcx [PATH]``: validate a download and import it.

Importing makes ``<cache>/gsm8k`` (``<cache>/calcx``) point at the download (a symbolic link;
``--copy`` copies instead), which is where the envs look when neither ``data_dir=`` nor the
environment variable is given. Validation reads every ``<split>.jsonl`` and checks that every
gold answer can be read by the answer checker. Without PATH the command says which data the
env would use now.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

__all__ = ["register_data_commands", "run_math_data_command", "validate_math_data"]


def register_data_commands(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``gsm8k`` and ``calcx`` to the ``data`` command's subparsers."""
    for name, title, env_id, layout in (
        ("gsm8k", "GSM8K", "lightning/GSM8K-v0", "test.jsonl and train.jsonl (openai/grade-school-math's data/ folder)"),
        ("calcx", "Calc-X", "lightning/CalcX-v0", "<split>.jsonl files (train, validation, test) with question and result"),
    ):
        parser = subparsers.add_parser(
            name,
            help=f"validate a {title} download and import it for {env_id}",
            description=(
                f"Validate a {title} download (a folder with {layout}, or one .jsonl file) and make {env_id} "
                f"use it. Without PATH, show which {title} data the env uses now."
            ),
        )
        parser.add_argument("path", nargs="?", help=f"the {title} folder or a .jsonl file")
        parser.add_argument("--copy", action="store_true", help="copy into the cache instead of linking")
        parser.add_argument("--no-import", action="store_true", help="only validate; change nothing")
        parser.add_argument("--force", action="store_true", help="replace a previously imported copy")
        parser.set_defaults(func=run_math_data_command, dataset=name)


def validate_math_data(name: str, path: str | Path) -> tuple[bool, str]:
    """Read every split at ``path``: ``(usable, a summary to print)``."""
    from .data import DATASETS, MathDataError, MathDataWarning, _check_path, _load, available_splits

    spec = DATASETS[name]
    try:
        root = _check_path(spec, Path(path), "")
    except MathDataError as exc:
        return False, f"error: {str(exc).strip()}"
    lines = [f"{spec.title} at {root}"]
    usable = 0
    for split in available_splits(root):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", MathDataWarning)
                data = _load(spec, split, root, "argument")
        except MathDataError as exc:
            lines.append(f"  {split}: error: {exc}")
            return False, "\n".join(lines)
        usable += len(data)
        skipped = f", skipped {len(data.skipped)} (first: line {data.skipped[0][0]}: {data.skipped[0][1]})" if data.skipped else ""
        lines.append(f"  {split}: {len(data)} problems, every gold answer readable{skipped}" if not skipped
                     else f"  {split}: {len(data)} problems{skipped}")
    if not usable:
        lines.append("  error: no usable problem")
    return usable > 0, "\n".join(lines)


def _status(name: str) -> int:
    from .data import DATASETS, MathDataError, MathDataWarning, load_math, resolve_data

    spec = DATASETS[name]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MathDataWarning)
            path, source = resolve_data(name)
            test = load_math(name, "test")
    except MathDataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    where = {
        "env": f"from ${spec.env_var}",
        "cache": "imported",
        "sample": "the bundled sample (no data found)",
        "argument": "given",
    }[source]
    print(f"{spec.env_id} uses {path or 'the bundled sample'}: {where}; test has {len(test)} problems")
    if source == "sample":
        print(f"Import real {spec.title} with: agentgym-lightning data {name} PATH")
    return 0


def run_math_data_command(args: argparse.Namespace) -> int:
    """The ``data gsm8k`` / ``data calcx`` command."""
    from agentgym_lightning.paths import cache_root, link_into_cache

    from .data import DATASETS

    name = args.dataset
    if not args.path:
        return _status(name)
    ok, summary = validate_math_data(name, args.path)
    print(summary)
    if not ok:
        print(f"error: this is not usable {DATASETS[name].title} data (see above)", file=sys.stderr)
        return 1
    if args.no_import:
        return 0
    try:
        target = link_into_cache(args.path, cache_root() / name, copy=args.copy, force=args.force)
    except FileExistsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"imported: {target} -> {Path(args.path).expanduser().resolve()}")
    print(f"{DATASETS[name].env_id} now uses it (data_dir= or ${DATASETS[name].env_var} still take precedence).")
    return 0
