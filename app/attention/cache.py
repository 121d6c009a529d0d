"""Key/value caches for incremental decoding."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class KVCache:
    """Keys and values of the positions decoded so far, one per attention layer.

    Shapes are (B, Hkv, T, Dh): only the key/value heads are stored, so a GQA/MQA layer with
    fewer kv heads keeps a proportionally smaller cache. ``static`` caches (cross-attention) are
    filled once from the encoder output and never grow. ``max_len`` (sliding-window attention)
    keeps only the most recent positions.
    """

    k: Tensor | None = None
    v: Tensor | None = None
    static: bool = False
    max_len: int | None = None

    @property
    def filled(self) -> bool:
        return self.k is not None

    def length(self) -> int:
        return 0 if self.k is None else self.k.size(2)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add the new step's keys/values (B, Hkv, t, Dh) and return the full cached tensors."""
        if self.k is None:
            self.k, self.v = k, v
        else:
            self.k = torch.cat([self.k, k], dim=2)
            self.v = torch.cat([self.v, v], dim=2)
        if self.max_len is not None and self.k.size(2) > self.max_len:
            self.k = self.k[:, :, -self.max_len :]
            self.v = self.v[:, :, -self.max_len :]
        return self.k, self.v

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search keeps the surviving hypotheses)."""
        if self.k is not None:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)
