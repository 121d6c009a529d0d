"""Atomic file writes: a reader (or a crash) sees the old file or the complete new one, never a part;
and :func:`pickled_globals`, what a pickle file would import, read without unpickling it.

Checkpoints (:func:`app.checkpoint.save_atomically`) and ``translate.py -o`` write through
:func:`atomic_write`: the content goes to a temporary file in the target's directory (the same file
system, so the final ``os.replace`` is a rename), which is synced and renamed over the target only
when the ``with`` block finishes without an exception; otherwise it is removed.
"""

from __future__ import annotations

import hashlib
import os
import pickletools
import tempfile
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "wb", **open_args: Any) -> Iterator[IO[Any]]:
    """A file object for ``path`` (``mode`` "w" or "wb", ``open_args`` as for ``open``), replaced at exit.

    The target's directory is created if needed. The new file gets the permissions ``open`` would give
    it (``mkstemp`` makes 0600; the umask is followed instead).
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write mode={mode!r}; valid choices: 'w', 'wb'")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_current_umask())
        with os.fdopen(fd, mode, **open_args) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flush ``path``'s content (or a directory's entries) to disk, so that a rename published after it
    never points at data a crash can still lose."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_sha256(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes, read in ``chunk``-byte pieces."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def move_aside(path: str | os.PathLike[str]) -> Path:
    """Rename a broken cache entry (file or directory) to ``<name>.corrupt-<unix time>`` beside it, out of
    the way of a rebuild but kept for inspection; returns the new path."""
    path = Path(path)
    target = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
    while target.exists():
        target = target.with_name(target.name + "x")
    path.rename(target)
    return target


_STRING_PUSHES = frozenset(
    {"UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "STRING", "BINSTRING", "SHORT_BINSTRING"}
)
_MEMO_GETS = frozenset({"GET", "BINGET", "LONG_BINGET"})
_MEMO_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"})


def _globals_in_one_pickle(stream: IO[bytes]) -> Iterator[str]:
    """``module.name`` of each global one pickle names (GLOBAL, INST, STACK_GLOBAL), read from its
    opcodes without unpickling; strings pushed for STACK_GLOBAL are followed through the memo."""
    memo: dict[int, str | None] = {}
    pushed: list[str | None] = [None, None]  # the last two values pushed, strings or None
    for opcode, arg, _ in pickletools.genops(stream):
        if opcode.name in ("GLOBAL", "INST"):
            yield ".".join(str(arg).split(" ", 1))
        elif opcode.name == "STACK_GLOBAL" and all(isinstance(v, str) for v in pushed):
            yield f"{pushed[0]}.{pushed[1]}"
        if opcode.name in _MEMO_PUTS:
            memo[len(memo) if opcode.name == "MEMOIZE" else int(arg)] = pushed[1]
            continue
        value = arg if opcode.name in _STRING_PUSHES else memo.get(arg) if opcode.name in _MEMO_GETS else None
        pushed = [pushed[1], value]
        if opcode.name == "STOP":
            return


def pickled_globals(path: str | os.PathLike[str]) -> Iterator[str]:
    """The classes and functions (``module.name``) a pickle file, or a torch zip archive's
    ``data.pkl``, would import when unpickled, found without unpickling it: what a file that a safe
    unpickler refused asked for. Legacy torch files hold several pickles one after another; up to 4
    are read. Raises ValueError (or another error) on bytes that are not a pickle."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n.endswith("data.pkl")]
            with archive.open(names[0]) as stream:
                yield from _globals_in_one_pickle(stream)
        return
    with open(path, "rb") as stream:
        for _ in range(4):
            yield from _globals_in_one_pickle(stream)
