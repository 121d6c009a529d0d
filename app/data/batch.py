"""A padded mini-batch of parallel sentences and the collate function that builds it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.data import Dataset


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


class ParallelIds(Dataset):
    """Token ids of a split (without specials); items are (index, src_ids, tgt_ids)."""

    def __init__(self, src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]]) -> None:
        if len(src) != len(tgt):
            raise ValueError(f"{len(src)} source but {len(tgt)} target sequences")
        self.src, self.tgt = src, tgt

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, index: int) -> tuple[int, Sequence[int], Sequence[int]]:
        return index, self.src[index], self.tgt[index]

    def lengths(self) -> list[int]:
        """Per example, the longer side including the special token added on each side."""
        return [max(len(s), len(t)) + 1 for s, t in zip(self.src, self.tgt, strict=True)]


@dataclass(frozen=True)
class Collator:
    """Adds EOS to sources, BOS/EOS to targets, and pads to the longest sequence in the batch."""

    pad_id: int
    bos_id: int
    eos_id: int

    def __call__(self, examples: list[tuple[int, Sequence[int], Sequence[int]]]) -> Batch:
        index = torch.tensor([e[0] for e in examples], dtype=torch.long)
        src = self._pad([[*e[1], self.eos_id] for e in examples])
        tgt_in = self._pad([[self.bos_id, *e[2]] for e in examples])
        tgt_out = self._pad([[*e[2], self.eos_id] for e in examples])
        return Batch(src=src, tgt_in=tgt_in, tgt_out=tgt_out, index=index, pad_id=self.pad_id)

    def _pad(self, rows: list[list[int]]) -> Tensor:
        out = torch.full((len(rows), max(len(r) for r in rows)), self.pad_id, dtype=torch.long)
        for i, row in enumerate(rows):
            out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        return out
