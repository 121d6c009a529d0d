"""Dropout whose random mask is cheap on a CPU.

PyTorch's CPU dropout draws one Bernoulli sample per element (``aten::bernoulli_``). On a 2-core CPU
that was 18% of a training step of the tiny en->de Transformer (dropout 0.3; ``torch.profiler``, see
docs/throughput.md). Here the mask is read off uniform 64-bit integers drawn from the same generator,
sliced into four 16-bit integers each, and compared with a threshold: a quarter of the draws, and no
floating point. The drop probability becomes ``p`` rounded to a multiple of 1/65,536 (off by at most
7.6e-6). The backward pass saves the boolean mask only (one byte per element).

On other devices (CUDA has its own fused kernel) torch's dropout is used as is.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_LEVELS = 1 << 16  # distinct values of a 16-bit slice


def keep_mask(shape: torch.Size, p: float, *, device: torch.device | str = "cpu") -> Tensor:
    """A bool mask of ``shape``, each element True (kept) with probability 1 - p (p in steps of 2^-16)."""
    count = math.prod(shape)
    words = torch.empty((count + 3) // 4, dtype=torch.int64, device=device)
    words.random_(-(2**63), None)  # uniform over all 2^64 values: every bit is a fair coin
    slices = words.view(torch.int16)[:count]  # four uniform integers in [-32768, 32768) per word
    threshold = round(p * _LEVELS) - _LEVELS // 2  # P(slice >= threshold) = 1 - round(p * 2^16) / 2^16
    return slices.ge(threshold).view(shape)


class _MaskedScale(torch.autograd.Function):
    """``x * keep * scale``, saving only the bool mask for the backward pass."""

    @staticmethod
    def forward(ctx, x: Tensor, keep: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x.mul(keep).mul_(scale)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        (keep,) = ctx.saved_tensors
        return grad.mul(keep).mul_(ctx.scale), None, None


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Inverted dropout: zero each element with probability ``p``, scale the rest by 1 / (1 - p)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, training)
    return _MaskedScale.apply(x, keep_mask(x.shape, p, device=x.device), 1.0 / (1.0 - p))


class Dropout(nn.Dropout):
    """``nn.Dropout`` with :func:`dropout`'s cheap CPU mask (same arguments, same state dict)."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)
