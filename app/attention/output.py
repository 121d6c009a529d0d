"""The result every attention kernel returns (its own module: the kernels and the caches both use it)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class AttentionOutput:
    """The result every kernel returns."""

    context: Tensor  # (B, H, Tq, Dh)
    weights: Tensor | None = None  # (B, H, Tq, Tk), only when asked for and supported
