"""A packed batch's sequences: B sequences laid end to end in N tokens, with no padding anywhere.

Why: a padded (B, S) batch spends work on its B*S - N padding positions in every matrix product and, worse on
a GPU, hands fused attention a dense mask that rules out its fastest backends. A packed batch keeps only the N
real tokens, as (N, D) rows, and describes where each sequence lies: its offsets (``cu_seqlens`` in flash-attn
and PyTorch's varlen attention), each token's sequence id (FlexAttention's "document" mask) and each token's
position within its sequence (positions restart at every sequence).

Attention kernels take packed queries, keys and values through :meth:`AttentionKernel.forward_packed`; a
kernel without a packed form of its own gets the padded (B, H, S, Dh) layout it always had, through
:meth:`padded` (the rows of :mod:`app.attention.packing`), so every kernel accepts a packed batch and gives
the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from app.attention.packing import PackedRows


@dataclass(frozen=True)
class Segments:
    """Where the B sequences of N packed tokens lie."""

    offsets: Tensor  # (B+1,) int64: sequence b holds tokens offsets[b] : offsets[b+1]; offsets[0] == 0
    ids: Tensor  # (N,) int64: the sequence of each token
    positions: Tensor  # (N,) int64: each token's position within its sequence, 0 at its first
    longest: int  # the longest sequence's length, known on the host (sizes padded views, block masks)

    @classmethod
    def of_lengths(
        cls, lengths: Tensor | Sequence[int], device: torch.device | str | None = None
    ) -> Segments:
        """The segments of sequences of ``lengths`` (B,), each at least one token, in order."""
        lengths = torch.as_tensor(lengths, dtype=torch.long, device=device)
        if lengths.dim() != 1 or lengths.numel() == 0:
            raise ValueError(f"lengths must be a non-empty (B,) tensor, got shape {tuple(lengths.shape)}")
        if bool((lengths < 1).any()):
            raise ValueError(f"every sequence needs at least one token, got lengths {lengths.tolist()}")
        offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])  # (B+1,)
        ids = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths)  # (N,)
        positions = torch.arange(int(offsets[-1]), device=lengths.device) - offsets[ids]  # (N,)
        return cls(offsets=offsets, ids=ids, positions=positions, longest=int(lengths.max()))

    @classmethod
    def of_mask(cls, mask: Tensor) -> Segments:
        """The segments of a right-padded batch's ``mask`` (B, S), True at its real tokens."""
        return cls.of_lengths(mask.sum(dim=1))

    @property
    def batch(self) -> int:
        return self.offsets.numel() - 1

    @property
    def tokens(self) -> int:
        return self.ids.numel()

    @property
    def lengths(self) -> Tensor:
        """(B,) each sequence's length."""
        return self.offsets.diff()

    def to(self, device: torch.device | str) -> Segments:
        return Segments(self.offsets.to(device), self.ids.to(device), self.positions.to(device), self.longest)

    def padded(self) -> PackedRows:
        """The (B, longest) right-padded layout of these sequences, as the rows that hold real tokens: its
        ``unpack`` turns packed (N, *F) into padded (B, longest, *F), its ``pack`` back."""
        index = self.ids * self.longest + self.positions  # (N,) flat b * S + s
        return PackedRows(index, self.ids, self.positions, self.batch, self.longest)

    def key_mask(self) -> Tensor:
        """(B, longest) True at real tokens: the padded layout's key mask."""
        steps = torch.arange(self.longest, device=self.offsets.device)
        return steps[None, :] < self.lengths[:, None]
