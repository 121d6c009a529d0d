"""A padded batch's real positions as one list of rows, for position-wise work without the padding.

Why: a batch of B sentences padded to S positions holds B*S rows, of which only the real tokens matter. In
the encoder everything except attention's weighted sum (the projections, the feed-forward layers, layer
norms, residual adds) treats each position alone, so it can run over the N real rows only. On the test
set in batches of 64 sorted by length, a quarter of the encoder's rows are padding (4,025 real tokens in
5,184 rows for the first 256 sentences of test_2016_flickr.de). Attention itself still sees the padded
(B, H, S, Dh) layout every kernel expects: :meth:`PackedRows.unpack` scatters rows into it, with zeros at
the padding, and :meth:`PackedRows.pack` gathers them back. CTranslate2 removes padding the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class PackedRows:
    """Where the N real positions of a (B, S) padded batch sit, in batch-major order."""

    index: Tensor  # (N,) flat positions b * S + s of the real tokens
    sentence: Tensor  # (N,) b of each
    position: Tensor  # (N,) s of each
    batch: int  # B
    length: int  # S

    @classmethod
    def of(cls, mask: Tensor) -> PackedRows:
        """The real positions of ``mask`` (B, S), True at real tokens."""
        batch, length = mask.shape
        index = mask.reshape(-1).nonzero().squeeze(1)
        return cls(index, index // length, index % length, batch, length)

    @property
    def rows(self) -> int:
        return self.index.numel()

    def pack(self, x: Tensor) -> Tensor:
        """(B, S, *F) -> (N, *F): the real positions' rows, in order. ``x`` may be a strided view (attention's
        heads seen as (B, S, H, Dh)): it is gathered from where it lies, never copied whole first."""
        if x.is_contiguous():
            return x.view(self.batch * self.length, *x.shape[2:]).index_select(0, self.index)
        return x[self.sentence, self.position]

    def unpack(self, rows: Tensor) -> Tensor:
        """(N, *F) -> (B, S, *F): ``rows`` at their positions, zeros at the padding."""
        features = rows.shape[1:]
        out = rows.new_zeros(self.batch * self.length, *features)
        out.index_copy_(0, self.index, rows)
        return out.view(self.batch, self.length, *features)
