"""What the benchmarks share to time things: where the repository and its configs are, a device-aware
median of repeated calls, and rates over windows of training steps. Light on purpose (torch only): the
decoding benchmarks import it without Lightning; what trains lives in :mod:`app.bench.runs`."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = REPO_ROOT / "conf"  # train.py's Hydra configs


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so a wall-clock reading covers it (a no-op on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(run: Callable[[], Any], *, repeats: int, warmup: int, device: torch.device) -> float:
    """Median wall-clock milliseconds of ``run`` over ``repeats`` calls, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        run()
        synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def window_rates(counts: list[int], ends: list[float], warmup: int, windows: int, size: int) -> list[float]:
    """``counts`` (tokens, FLOPs) per second of each window of ``size`` steps after ``warmup`` steps.

    ``ends[i]`` is when step ``i`` finished; a window's steps are start+1 .. start+size, timed from the
    end of step start, so no window includes the time before its first step began.
    """
    rates = []
    for w in range(windows):
        start = warmup + w * size
        total = sum(counts[start + 1 : start + size + 1])
        rates.append(total / (ends[start + size] - ends[start]))
    return rates
