"""glibc's malloc told to keep large freed blocks while a process decodes on the CPU.

Why: a decoding step allocates and frees tensors of several megabytes (beam 5 at batch 64: the logits and
log-probabilities, 320 x 8,000 floats = 10 MB each). glibc serves blocks above its mmap threshold with fresh
``mmap`` calls and returns freed heap tops above its trim threshold to the kernel; both thresholds move with
the allocation history. Every page of memory the kernel hands back is faulted in and zeroed again on first
touch: 14,000-83,000 page faults per 256 sentences at beam 5 in fresh processes, ~4,000-9,000 with the
thresholds fixed high, and a few percent of the time (docs/bench/decoding.md, "The encoder without its
padding"). :func:`keep_freed_memory` fixes them with ``mallopt``: blocks up to 32 MB come from the heap,
and up to 128 MB of freed heap stays with the process. Where the user set glibc's own ``MALLOC_*_``
variables, or the C library is not glibc, nothing changes.
"""

from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (glibc's malloc.h)
MMAP_THRESHOLD = 32 << 20  # bytes: larger blocks still get their own mapping
TRIM_THRESHOLD = 128 << 20  # bytes of free memory at the heap's top before glibc gives it back


def keep_freed_memory() -> str | None:
    """Fix glibc's mmap and trim thresholds (see the module doc); returns why not, or None when set."""
    if any(name.startswith("MALLOC_") and name.endswith("_") for name in os.environ):
        return "glibc's MALLOC_*_ variables are set: they decide"
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 (present in glibc only)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "the C library is not glibc"
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    if not (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return "mallopt refused the thresholds"
    return None
