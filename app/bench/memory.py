"""Memory readings for the benchmarks: a process's peak and anonymous RSS, and the peak bytes that one
call allocates (CUDA's allocator statistics, or on a CPU the running total of ``torch.profiler``'s
memory events)."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import resource
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

PEAK_UNMEASURED = "unmeasured"  # a CSV cell for a peak that no allocation could show


def peak_rss_mb() -> int:
    """This process's peak resident set size so far, in MiB (Linux reports KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def anon_rss_mb() -> int | None:
    """This process's anonymous resident memory now, in MiB: RSS without the file-backed pages of
    memory-mapped Arrow files, which the page cache shares between processes and can evict. None
    where ``/proc/self/status`` has no ``RssAnon`` (not Linux)."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("RssAnon:"):
            return round(int(line.split()[1]) / 1024)
    return None


def parse_bytes(text: str) -> int:
    """'4GiB', '512M', '1e9' -> bytes (K/M/G/T are binary multiples); an argparse type."""
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([KMGT]?)(i?B)?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4GiB, 512M, 1e9)")
    scale = 1024 ** " KMGT".index(match.group(2) or " ")
    return int(float(match.group(1)) * scale)


def is_out_of_memory(err: BaseException) -> bool:
    """True for an allocation failure on any device (CUDA's own error type, or a message that says so)."""
    return isinstance(err, torch.cuda.OutOfMemoryError | MemoryError) or "out of memory" in str(err).lower()


def peak_bytes(run: Callable[[], Any], device: torch.device) -> int | None:
    """Bytes that one call of ``run`` allocates at its peak, beyond what was allocated before it.

    ``None`` when the peak cannot be measured: the CPU profiler recorded no allocation at all.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        run()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    activities = [torch.profiler.ProfilerActivity.CPU]
    with quiet_stderr(), torch.profiler.profile(activities=activities, profile_memory=True) as prof:
        run()
    exact = cpu_peak_from_allocations(prof)
    return exact if exact is not None else cpu_peak_from_events(prof.events())


def cpu_peak_from_allocations(prof: torch.profiler.profile) -> int | None:
    """The running total's maximum over every CPU allocation and free the profiler recorded, in time order.

    Exact where :func:`cpu_peak_from_events` is not: frees made inside an op between its children (a
    Python autograd Function's backward loop, say) count when they happen, not when the op ends. Reads
    the profiler's event tree (``torch._C._profiler``, not a public API): None where it is unavailable or
    holds no allocation, and the caller falls back to the op-level events.
    """
    try:
        from torch._C._profiler import _EventType

        stack = list(prof.profiler.kineto_results.experimental_event_tree())
    except (AttributeError, ImportError, RuntimeError):
        return None
    changes: list[tuple[int, int]] = []  # (time in ns, bytes: + allocated, - freed)
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
            changes.append((event.start_time_ns, event.extra_fields.alloc_size))
    if not changes:
        return None
    total = peak = 0
    for _, nbytes in sorted(changes):
        total += nbytes
        peak = max(peak, total)
    return peak


def cpu_peak_from_events(events: Iterable[Any]) -> int | None:
    """The running total's maximum over the net CPU bytes of the profiler's events, in time order.

    Public ``FunctionEvent`` fields only: an op's ``cpu_memory_usage`` includes its children's, so each
    op without children counts its own (at its start) and each parent only its ``self_cpu_memory_usage``
    (allocations at its start, frees at its end); frees outside any op are top-level ``[memory]`` events.
    Allocations a parent makes and frees between two of its children are not seen (ops' granularity).
    """
    changes: list[tuple[float, int]] = []  # (time in us, net bytes)

    def visit(event: Any) -> None:
        if not event.cpu_children:
            changes.append((event.time_range.start, event.cpu_memory_usage))
            return
        for child in event.cpu_children:
            visit(child)
        own = event.self_cpu_memory_usage
        changes.append((event.time_range.start if own > 0 else event.time_range.end, own))

    for event in events:
        if event.cpu_parent is None:
            visit(event)
    if not any(nbytes for _, nbytes in changes):
        return None
    total = peak = 0
    for _, nbytes in sorted(changes, key=lambda change: change[0]):
        total += nbytes
        peak = max(peak, total)
    return peak


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 (the profiler's C++ start/stop lines) for the duration of the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
