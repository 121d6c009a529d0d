"""Lines in and out for ``translate.py``: bytes to text, groups of lines, and where the output goes.

Lines are split on ``\\n`` only (a trailing ``\\r`` is removed) and invalid UTF-8 is replaced with a
warning, so a line is never dropped or split. A group of lines is handed on as soon as it is complete,
so a program that writes one line to a pipe and waits gets its answer (``--buffer-size 1``). Output to a
file is atomic; output to a pipe whose reader went away ends quietly; output that cannot be written (a
directory that cannot hold the file, a full disk, ``/dev/full``) is an :class:`OutputError` naming it.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO, TextIO

from app.inference.engine import Translation
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


class OutputError(ValueError):
    """An output that cannot be written, named with the reason (``translate.py`` exits 2 on it)."""

    @classmethod
    def of(cls, what: str, err: OSError) -> OutputError:
        """``cannot write WHAT: REASON`` from the OSError that said why."""
        return cls(f"cannot write {what}: {_why(err)}")


def _why(err: OSError) -> str:
    return err.strerror or str(err)


class _CheckedOutput:
    """A text stream whose failed writes raise :class:`OutputError` naming it (``BrokenPipeError``, a reader
    that went away, passes as it is: the caller ends quietly on it)."""

    def __init__(self, stream: TextIO, name: str) -> None:
        self._stream, self.name = stream, name

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as err:
            raise OutputError.of(self.name, err) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as err:
            raise OutputError.of(self.name, err) from None


@contextmanager
def output_file(path: str | None) -> Iterator[TextIO]:
    """Standard output, or ``path`` written atomically: a run that fails part-way (a decoding error,
    Ctrl-C) leaves the previous file, or none, rather than the translations of the first lines only.
    A path that is not a regular file (``/dev/stdout``, a pipe) is written directly. Opening, writing or
    finishing the output fails with an :class:`OutputError` naming it; errors of the ``with`` block's
    own work pass unchanged."""
    if path is None:
        sys.stdout.reconfigure(encoding="utf-8")  # translations may hold any character
        try:
            yield _CheckedOutput(sys.stdout, "standard output")  # type: ignore[misc]
        except OutputError:
            silence_stdout()  # what the failed write left in the buffer would fail again at exit
            raise
    elif Path(path).exists() and not Path(path).is_file():
        yield from _write_directly(path)
    else:
        yield from _write_atomically(path)


def _write_directly(path: str) -> Iterator[TextIO]:
    """A device or pipe (``/dev/full``, a FIFO): opened, written and closed in place."""
    try:
        handle = open(path, "w", encoding="utf-8")  # noqa: SIM115 (closed below, whatever happens)
    except OSError as err:
        raise OutputError.of(path, err) from None
    out = _CheckedOutput(handle, path)
    try:
        yield out  # type: ignore[misc]
        out.flush()
    finally:
        with suppress(OSError):  # only what a failed flush left behind: that failure is reported
            handle.close()


def _write_atomically(path: str) -> Iterator[TextIO]:
    """A regular file through :func:`app.io.atomic_write`; its own failures (the directory cannot be
    made or written, the final sync or rename fails) become an :class:`OutputError`."""
    above = next((parent for parent in Path(path).parents if parent.exists()), None)
    if above is not None and not above.is_dir():
        raise OutputError(f"cannot write {path}: {above} is not a directory")
    in_block = False
    try:
        with atomic_write(path, "w", encoding="utf-8") as handle:
            in_block = True
            yield _CheckedOutput(handle, path)  # type: ignore[misc]
            in_block = False
    except OSError as err:
        if in_block or isinstance(err, BrokenPipeError):  # the block's own error, not the file's
            raise
        raise OutputError.of(path, err) from None


def jsonl_record(source: str, translations: list[Translation], target_lang: str | None = None) -> str:
    """One JSON line: the input, its hypotheses (best first) with total and per-token scores and, from
    the torch engine, the alignment as [target subword, most attended source subword] pairs; with a
    ``target_lang`` (``--tgt-lang``), that language too. Always valid JSON: a score that is not a finite
    number (a token the model gave no probability) is null."""
    record = {
        "input": source,
        **({"target_lang": target_lang} if target_lang else {}),
        "hypotheses": [
            {
                "text": t.text,
                "score": _finite(t.score),
                "token_scores": [_finite(score) for score in t.token_scores],
                **({"alignment": [list(pair) for pair in t.alignment]} if t.alignment is not None else {}),
            }
            for t in translations
        ],
    }
    return json.dumps(record, ensure_ascii=False, allow_nan=False)


def _finite(value: float) -> float | None:
    """A score as JSON can hold it: NaN and infinities (which ``json.dumps`` writes as the non-JSON
    ``NaN``, ``Infinity``) become null."""
    return value if math.isfinite(value) else None
