"""What the machine can do fast, so configs can say ``precision: auto``."""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


def cpu_has_fast_bf16() -> bool:
    """True when oneDNN has native bf16 matrix kernels here (AVX512-BF16 or AMX).

    Without them bf16 matmuls are emulated and run several times slower than fp32 (measured on an
    AVX2-only EPYC: 16 vs 110 GFLOP/s), so bf16 autocast would slow training down.
    """
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def resolve_precision(precision: str | int, accelerator: str = "auto") -> str | int:
    """Turn ``auto`` into bf16-mixed where bf16 is fast (recent GPUs, bf16-capable CPUs), else 32-true."""
    if precision != "auto":
        return precision
    on_gpu = torch.cuda.is_available() and accelerator in ("auto", "gpu", "cuda")
    fast = torch.cuda.is_bf16_supported() if on_gpu else cpu_has_fast_bf16()
    chosen = "bf16-mixed" if fast else "32-true"
    log.info("precision=auto -> %s (%s)", chosen, "GPU" if on_gpu else "CPU")
    return chosen
