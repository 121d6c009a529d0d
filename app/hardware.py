"""What the machine can do fast, so configs can say ``precision: auto``."""

from __future__ import annotations

import logging
import platform
import statistics
import time
from pathlib import Path

import torch

log = logging.getLogger(__name__)


# CPU feature flags (as /proc/cpuinfo names them) of native bf16 matrix instructions: x86 AVX512-BF16 and
# AMX-BF16, Arm's BF16 extension ("bf16" on the Features line of aarch64 kernels).
FAST_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The feature flags the kernel reports for the first CPU (empty where there is no ``cpuinfo``)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def cpu_has_fast_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """True when the CPU has native bf16 matrix instructions (AVX512-BF16, AMX-BF16 or Arm BF16).

    Without them bf16 matmuls are emulated and run several times slower than fp32 (measured on an
    AVX2-only EPYC: 16 vs 110 GFLOP/s), so bf16 autocast would slow training down. Where the flags
    cannot be read (no ``/proc/cpuinfo``: macOS, Windows) the answer is False: fp32 is the safe default.
    """
    flags = cpu_flags(cpuinfo)
    if not flags:
        log.info("no CPU feature flags in %s: assuming no fast bf16", cpuinfo)
    return bool(flags & FAST_BF16_FLAGS)


def fast_bf16(device: str | torch.device = "cpu", cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """The one rule for "bf16 is fast here": ``device`` computes bf16 matrix products natively.

    On a CPU: AVX512-BF16, AMX-BF16 or Arm BF16 in its flags (:func:`cpu_has_fast_bf16`). On a GPU: bf16
    in hardware (compute capability 8.0 and up on NVIDIA); ``torch.cuda.is_bf16_supported()`` alone also
    counts bf16 that an older GPU only emulates, slower than fp32. ``precision: auto``
    (:func:`resolve_precision`) and ``make demo``'s recipe (:mod:`app.training.recipes`, which also
    measures the speed-up its larger bf16 model needs) both decide here.
    """
    if torch.device(device).type == "cuda":
        return cuda_has_native_bf16()
    return cpu_has_fast_bf16(cpuinfo)


def cuda_has_native_bf16() -> bool:
    """True when the current GPU has bf16 in hardware, emulation not counted."""
    try:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # a torch without the argument: native bf16 starts at compute capability 8.0
        return torch.cuda.get_device_capability()[0] >= 8


def resolve_precision(precision: str | int, accelerator: str = "auto") -> str | int:
    """Turn ``auto`` into bf16-mixed where bf16 is fast (:func:`fast_bf16`), else 32-true."""
    if precision != "auto":
        return precision
    on_gpu = torch.cuda.is_available() and accelerator in ("auto", "gpu", "cuda")
    chosen = "bf16-mixed" if fast_bf16("cuda" if on_gpu else "cpu") else "32-true"
    log.info("precision=auto -> %s (%s)", chosen, "GPU" if on_gpu else "CPU")
    return chosen


def has_fast_matmul(
    dtype: torch.dtype, device: str | torch.device = "cpu", cpuinfo: Path = Path("/proc/cpuinfo")
) -> bool:
    """False where ``dtype`` matrix products have no native path on ``device``: bf16 where
    :func:`fast_bf16` says no. Every other dtype is taken to be fast (fp32 always is)."""
    return dtype != torch.bfloat16 or fast_bf16(device, cpuinfo)


def matmul_peak_tflops(
    dtype: torch.dtype,
    *,
    size: int | None = None,
    repeats: int = 7,
    device: str | torch.device = "cpu",
    cpuinfo: Path = Path("/proc/cpuinfo"),
) -> float | None:
    """Measured TFLOP/s of a ``size`` x ``size`` matrix product in ``dtype`` on ``device`` right now, or
    None, with no product run, where the dtype has no fast path there (:func:`has_fast_matmul`).

    The denominator of model FLOP utilisation: what this machine's matrix kernels reach on a large,
    well-shaped product (the median of ``repeats`` timed products after one warm-up), so MFU is a ratio
    taken on the same machine, threads and load as the model it judges. ``size`` defaults to 2048 on a
    CPU and 8192 on a GPU (a 2048 product is too small to fill a data-centre GPU). An emulated dtype is
    not measured: on an AVX2-only CPU one bf16 1024 x 1024 product takes 2.5 s, so the 2048 measurement
    would take minutes for a peak that no training there runs at (``precision: auto`` picks fp32).
    """
    device = torch.device(device)
    if not has_fast_matmul(dtype, device, cpuinfo):
        log.info("no fast %s matrix products on %s: its peak is not measured", dtype, device)
        return None
    on_gpu = device.type == "cuda"
    size = size or (8192 if on_gpu else 2048)
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    torch.matmul(a, b)  # warm-up: oneDNN / cuBLAS picks and caches its kernel
    times = []
    for _ in range(repeats):
        if on_gpu:
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        torch.matmul(a, b)
        if on_gpu:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - started)
    return 2 * size**3 / statistics.median(times) / 1e12


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's marketing name (``model name`` in /proc/cpuinfo on Linux), for benchmark records."""
    try:
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:  # not Linux: the name from platform
        pass
    return platform.processor() or platform.machine()


def machine_description(device: str | torch.device = "cpu") -> dict[str, object]:
    """Where a run ran, for its results.json and the reports that compare runs: the accelerator (or
    ``cpu``), the CPU model and flags, the torch build and its intra-op threads."""
    device = torch.device(device)
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        **cpu_description(),
    }


def cpu_description() -> dict[str, object]:
    """The CPU model and the instruction-set flags that decide matrix speed, for benchmark records."""
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8", "bf16")
    flags = cpu_flags()
    return {"cpu_model": cpu_model(), "cpu_flags": [f for f in wanted if f in flags]}


def usable_device(name: str | torch.device) -> torch.device:
    """``name`` as a device this process can compute on, checked before anything is loaded onto it.

    A ValueError names the device and why not: a name torch does not know (``gpu``), CUDA on a torch
    built without it or with no GPU visible, a GPU index past the last one, MPS where there is none.
    Without this, a model moved there fails deep inside torch (``Torch not compiled with CUDA enabled``).
    """
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ValueError(f"unknown device {str(name)!r}: use cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise ValueError(f"device {str(name)!r} is not available: {why}; use cpu")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(
                f"device {str(name)!r} is not available: {count} GPU(s), cuda:0 to cuda:{count - 1}"
            )
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {str(name)!r} is not available on this machine; use cpu")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device {str(name)!r} is not supported here: use cpu, cuda or cuda:N")
    return device
