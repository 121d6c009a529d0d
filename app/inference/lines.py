"""Lines in and out for ``translate.py``: bytes to text, groups of lines, and where the output goes.

Lines are split on ``\\n`` only (a trailing ``\\r`` is removed) and invalid UTF-8 is replaced with a
warning, so a line is never dropped or split. A group of lines is handed on as soon as it is complete,
so a program that writes one line to a pipe and waits gets its answer (``--buffer-size 1``). Output to a
file is atomic; output to a pipe whose reader went away ends quietly.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, TextIO

from app.io import atomic_write


def decode_lines(raw: BinaryIO, warn: TextIO) -> Iterator[str]:
    """Lines of a byte stream as text, split on b'\\n' only; bad UTF-8 is replaced with a warning."""
    for number, line in enumerate(raw, start=1):
        line = line.removesuffix(b"\n").removesuffix(b"\r")
        try:
            yield line.decode("utf-8")
        except UnicodeDecodeError:
            print(f"warning: line {number}: invalid UTF-8 replaced with U+FFFD", file=warn)
            yield line.decode("utf-8", errors="replace")


def chunks(lines: Iterable[str], size: int, flush_each: bool = False) -> Iterator[list[str]]:
    """Groups of ``size`` lines (the last may be shorter); single lines with ``flush_each``. A group is
    handed on as soon as it is complete: nothing waits for lines beyond it."""
    if size < 1:
        raise ValueError(f"--buffer-size must be >= 1, got {size}")
    group: list[str] = []
    for line in lines:
        group.append(line)
        if flush_each or len(group) == size:
            yield group
            group = []
    if group:
        yield group


def silence_stdout() -> None:
    """Point standard output at /dev/null, so the interpreter's final flush of what the closed pipe
    did not take raises no second BrokenPipeError ("Exception ignored ..." on stderr)."""
    try:
        fileno = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (a test's capture): nothing to flush
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fileno)
    os.close(devnull)


@contextmanager
def output_file(path: str | None) -> Iterator[TextIO]:
    """Standard output, or ``path`` written atomically: a run that fails part-way (a decoding error,
    Ctrl-C) leaves the previous file, or none, rather than the translations of the first lines only.
    A path that is not a regular file (``/dev/stdout``, a pipe) is written directly."""
    if path is None:
        sys.stdout.reconfigure(encoding="utf-8")  # translations may hold any character
        yield sys.stdout
    elif Path(path).exists() and not Path(path).is_file():
        with open(path, "w", encoding="utf-8") as out:
            yield out
    else:
        with atomic_write(path, "w", encoding="utf-8") as out:
            yield out
