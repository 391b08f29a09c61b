"""A run folder's files, read as the untrusted input they are.

Run folders are shared, downloaded and copied, and ``view``, ``report`` and ``sft`` read them. A
file there may be a FIFO (opening it for reading waits for a writer: the reader hangs), a symlink
to ``/dev/zero`` (an endless line), or one huge line. Every reader of a run folder opens its files
through :func:`open_run_file` and reads them through :func:`iter_lines`, so:

- only regular files are read: the file is opened without blocking and refused unless ``fstat``
  says it is a regular file (a FIFO, a device, a socket, a folder are refused, whatever link led
  there);
- a file over ``max_bytes`` (:data:`MAX_FILE_BYTES`) is refused before any of it is read;
- lines stream one at a time, and a line over :data:`MAX_LINE_BYTES` is never held: it is
  skipped, read past in pieces, and reported.

A refusal is a :class:`RunFileError` (a ``ValueError``) saying which file and why, so a reader
can skip that file and list it, and the other files and runs are read as before.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["RunFileError", "open_run_file", "iter_lines", "read_run_text", "MAX_FILE_BYTES", "MAX_LINE_BYTES", "LONG_LINE"]

#: The largest run file read (a long run's episode or metrics file is far smaller).
MAX_FILE_BYTES = 1 << 30
#: The longest line read (one episode with its token ids is a few MB at most).
MAX_LINE_BYTES = 64 << 20
#: What :func:`iter_lines` yields in place of a line over :data:`MAX_LINE_BYTES`.
LONG_LINE = b""

_PIECE = 1 << 20


class RunFileError(ValueError):
    """A run folder's file that is not read: not a regular file, or too large."""


def open_run_file(path: str | os.PathLike[str], max_bytes: int = MAX_FILE_BYTES) -> BinaryIO:
    """``path`` opened for reading in binary, if it is a regular file of at most ``max_bytes``;
    else :class:`RunFileError` (``FileNotFoundError`` when there is none)."""
    # O_NONBLOCK: opening a FIFO for reading would otherwise wait, forever, for a writer.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise RunFileError(f"{path}: not a regular file (a FIFO, a device or a folder is not read)")
        if info.st_size > max_bytes:
            raise RunFileError(f"{path}: {info.st_size:,} bytes, over the {max_bytes:,} a run file may have; not read")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def iter_lines(fh: BinaryIO, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes]]:
    """``(line number, line)`` of ``fh`` one at a time, each with its newline (the last may have
    none); a line over ``max_line_bytes`` is read past in pieces and yielded as :data:`LONG_LINE`
    (empty: nothing of it is held)."""
    lineno = 0
    while True:
        raw = fh.readline(max_line_bytes + 1)
        if not raw:
            return
        lineno += 1
        if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
            while (piece := fh.readline(_PIECE)) and not piece.endswith(b"\n"):
                pass
            yield lineno, LONG_LINE
            continue
        yield lineno, raw


def read_run_text(path: str | os.PathLike[str], max_bytes: int = MAX_LINE_BYTES) -> str:
    """A small run file's whole text (a ``trainer_state.json``), through :func:`open_run_file`
    with ``max_bytes``; ``UnicodeDecodeError`` when it is not UTF-8."""
    with open_run_file(Path(path), max_bytes) as fh:
        return fh.read().decode("utf-8")
