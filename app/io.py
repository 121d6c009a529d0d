"""Atomic file writes: a reader (or a crash) sees the old file or the complete new one, never a part.

Checkpoints (:func:`app.checkpoint.save_atomically`) and ``translate.py -o`` write through
:func:`atomic_write`: the content goes to a temporary file in the target's directory (the same file
system, so the final ``os.replace`` is a rename), which is synced and renamed over the target only
when the ``with`` block finishes without an exception; otherwise it is removed.
"""

from __future__ import annotations

import os
import tempfile
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
