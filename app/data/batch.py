"""A padded mini-batch of parallel sentences and the collate function that builds it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


@dataclass
class Batch:
    src: Tensor  # (B, S) source ids + EOS, right-padded
    tgt_in: Tensor  # (B, T) BOS + target ids (decoder input)
    tgt_out: Tensor  # (B, T) target ids + EOS (what the decoder predicts)
    index: Tensor  # (B,) positions of the examples in their split
    pad_id: int

    @property
    def num_target_tokens(self) -> int:
        return int(self.tgt_out.ne(self.pad_id).sum())

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) source + target tokens, the unit of throughput figures."""
        return int(self.src.ne(self.pad_id).sum()) + self.num_target_tokens


@dataclass(frozen=True)
class Collator:
    """Adds EOS to sources, BOS/EOS to targets, and pads to the longest sequence in the batch.

    Examples are ``(index, src_ids, tgt_ids)`` with ids as lists or numpy arrays (:class:`EncodedPairs`).
    """

    pad_id: int
    bos_id: int
    eos_id: int

    def __call__(self, examples: list[tuple[int, Sequence[int], Sequence[int]]]) -> Batch:
        index = torch.tensor([e[0] for e in examples], dtype=torch.long)
        sources, targets = [e[1] for e in examples], [e[2] for e in examples]
        src = self._pad(sources, append=self.eos_id)
        tgt_in = self._pad(targets, prepend=self.bos_id)
        tgt_out = self._pad(targets, append=self.eos_id)
        return Batch(src=src, tgt_in=tgt_in, tgt_out=tgt_out, index=index, pad_id=self.pad_id)

    def _pad(
        self, rows: list[Sequence[int]], *, prepend: int | None = None, append: int | None = None
    ) -> Tensor:
        """(B, longest + 1): each row with one special token before or after it, then padding."""
        out = np.full((len(rows), max(map(len, rows)) + 1), self.pad_id, dtype=np.int64)
        start = 0 if prepend is None else 1
        for i, row in enumerate(rows):
            out[i, start : start + len(row)] = row
            if prepend is not None:
                out[i, 0] = prepend
            if append is not None:
                out[i, len(row)] = append
        return torch.from_numpy(out)
