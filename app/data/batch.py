"""Mini-batches of parallel sentences, padded or packed, and the collate function that builds them.

Two layouts (``data.layout``): ``padded`` (:class:`Batch`) right-pads every sentence to the batch's longest,
the layout decoding and every model family read; ``packed`` (:class:`PackedBatch`) lays the sentences end to
end with no padding at all, described by their :class:`~app.attention.segments.Segments`, so that a
Transformer's teacher-forced forward pass spends no work on padding (issue 48). Both count their real tokens
here, on the host, as Python ints, so that the training loop reads them without waiting for the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np
import torch
from torch import Tensor

from app.attention.segments import Segments
from app.models.flops import batch_lengths

LAYOUTS = ("padded", "packed")  # data.layout's choices


class BatchLayoutError(ValueError):
    """A ``data.layout`` or ``data.pad_to_multiple`` that cannot work (named, with the valid choices)."""


def check_layout(layout: str, pad_to_multiple: int = 1) -> None:
    """Refuse a ``data.layout`` or ``data.pad_to_multiple`` that cannot work, naming it and the choices."""
    if layout not in LAYOUTS:
        raise BatchLayoutError(f"data.layout={layout!r}; valid choices: {', '.join(LAYOUTS)}")
    if isinstance(pad_to_multiple, bool) or not isinstance(pad_to_multiple, int) or pad_to_multiple < 1:
        raise BatchLayoutError(
            f"data.pad_to_multiple={pad_to_multiple!r} must be an integer >= 1 (1: off; 8 suits a GPU)"
        )


@dataclass
class Batch:
    src: Tensor  # (B, S) source ids + EOS, right-padded
    tgt_in: Tensor  # (B, T) BOS + target ids (decoder input)
    tgt_out: Tensor  # (B, T) target ids + EOS (what the decoder predicts)
    index: Tensor  # (B,) positions of the examples in their split
    pad_id: int
    # Real source and target tokens, counted by the collator on the host (computed here when left out).
    num_src_tokens: int = field(default=-1)
    num_target_tokens: int = field(default=-1)

    def __post_init__(self) -> None:
        if self.num_src_tokens < 0:
            self.num_src_tokens = int(self.src.ne(self.pad_id).sum())
        if self.num_target_tokens < 0:
            self.num_target_tokens = int(self.tgt_out.ne(self.pad_id).sum())

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) source + target tokens, the unit of throughput figures."""
        return self.num_src_tokens + self.num_target_tokens

    @property
    def sentences(self) -> int:
        return self.src.size(0)

    @property
    def slots(self) -> int:
        """Token positions the batch holds, padding included."""
        return self.src.numel() + self.tgt_out.numel()

    def sequence_lengths(self) -> tuple[Tensor, Tensor]:
        """Real lengths (B,) of each source (ids + EOS) and target (ids + EOS)."""
        return batch_lengths(self.src, self.tgt_out, self.pad_id)

    def source_ids(self) -> list[list[int]]:
        """Each sentence's source ids (+ EOS), without padding: what decoding reads."""
        return [row[row != self.pad_id].tolist() for row in self.src]


@dataclass(frozen=True)
class PackedBatch:
    """The same sentences as :class:`Batch`, laid end to end: no padding anywhere.

    Sentence b's source is ``src[src_segments.offsets[b] : src_segments.offsets[b + 1]]``, its target
    likewise in ``tgt_in`` / ``tgt_out`` with ``tgt_segments``. ``.to(device)`` moves it whole (Lightning's
    batch transfer calls it).
    """

    src: Tensor  # (Ns,) each source's ids + EOS, one after another
    tgt_in: Tensor  # (Nt,) BOS + each target's ids
    tgt_out: Tensor  # (Nt,) each target's ids + EOS
    src_segments: Segments  # B sources of Ns tokens
    tgt_segments: Segments  # their B targets of Nt tokens, in the same order
    index: Tensor  # (B,) positions of the examples in their split
    pad_id: int
    num_src_tokens: int  # Ns, on the host
    num_target_tokens: int  # Nt, on the host

    @property
    def num_tokens(self) -> int:
        """Source + target tokens, all real: the unit of throughput figures."""
        return self.num_src_tokens + self.num_target_tokens

    @property
    def sentences(self) -> int:
        return self.index.numel()

    @property
    def slots(self) -> int:
        return self.num_tokens

    def sequence_lengths(self) -> tuple[Tensor, Tensor]:
        """Lengths (B,) of each source (ids + EOS) and target (ids + EOS)."""
        return self.src_segments.lengths, self.tgt_segments.lengths

    def source_ids(self) -> list[list[int]]:
        """Each sentence's source ids (+ EOS): what decoding reads."""
        ids, offsets = self.src.tolist(), self.src_segments.offsets.tolist()
        return [ids[start:end] for start, end in pairwise(offsets)]

    def to(self, device: torch.device | str, **kwargs: object) -> PackedBatch:
        """This batch on ``device`` (Lightning's ``non_blocking`` and other options are ignored)."""
        return PackedBatch(
            src=self.src.to(device),
            tgt_in=self.tgt_in.to(device),
            tgt_out=self.tgt_out.to(device),
            src_segments=self.src_segments.to(device),
            tgt_segments=self.tgt_segments.to(device),
            index=self.index.to(device),
            pad_id=self.pad_id,
            num_src_tokens=self.num_src_tokens,
            num_target_tokens=self.num_target_tokens,
        )

    def twice(self) -> PackedBatch:
        """The batch followed by a copy of itself (2B sentences): R-Drop's two passes in one. Built on the
        device without reading it back: the copy's offsets and sequence ids are shifted, positions kept."""

        def doubled(segments: Segments) -> Segments:
            shift = segments.offsets[-1:]
            return Segments(
                offsets=torch.cat([segments.offsets, segments.offsets[1:] + shift]),
                ids=torch.cat([segments.ids, segments.ids + segments.batch]),
                positions=segments.positions.repeat(2),
                longest=segments.longest,
            )

        return PackedBatch(
            src=self.src.repeat(2),
            tgt_in=self.tgt_in.repeat(2),
            tgt_out=self.tgt_out.repeat(2),
            src_segments=doubled(self.src_segments),
            tgt_segments=doubled(self.tgt_segments),
            index=self.index.repeat(2),
            pad_id=self.pad_id,
            num_src_tokens=2 * self.num_src_tokens,
            num_target_tokens=2 * self.num_target_tokens,
        )


@dataclass(frozen=True)
class Collator:
    """Adds EOS to sources, BOS/EOS to targets, then pads them (``layout="padded"``: to the longest
    sequence in the batch, rounded up to a multiple of ``pad_to_multiple`` but not past ``max_width``) or
    packs them (``layout="packed"``, :class:`PackedBatch`; ``pad_to_multiple`` does not apply).

    Examples are ``(index, src_ids, tgt_ids)`` with ids as lists or numpy arrays (:class:`EncodedPairs`).
    """

    pad_id: int
    bos_id: int
    eos_id: int
    layout: str = "padded"
    pad_to_multiple: int = 1
    max_width: int | None = None  # the rounding never pads past this (the model's max_positions)

    def __post_init__(self) -> None:
        check_layout(self.layout, self.pad_to_multiple)

    def __call__(self, examples: list[tuple[int, Sequence[int], Sequence[int]]]) -> Batch | PackedBatch:
        index = torch.tensor([e[0] for e in examples], dtype=torch.long)
        sources, targets = [e[1] for e in examples], [e[2] for e in examples]
        if self.layout == "packed":
            return self._packed(index, sources, targets)
        src = self._pad(sources, append=self.eos_id)
        tgt_in = self._pad(targets, prepend=self.bos_id)
        tgt_out = self._pad(targets, append=self.eos_id)
        return Batch(
            src=src,
            tgt_in=tgt_in,
            tgt_out=tgt_out,
            index=index,
            pad_id=self.pad_id,
            num_src_tokens=sum(map(len, sources)) + len(sources),
            num_target_tokens=sum(map(len, targets)) + len(targets),
        )

    def _pad(
        self, rows: list[Sequence[int]], *, prepend: int | None = None, append: int | None = None
    ) -> Tensor:
        """(B, width): each row with one special token before or after it, then padding; width is the
        longest + 1, rounded up to a multiple of ``pad_to_multiple`` but not past ``max_width``."""
        longest, multiple = max(map(len, rows)) + 1, self.pad_to_multiple
        width = -(-longest // multiple) * multiple
        if self.max_width is not None:  # positions past max_positions would not embed
            width = max(longest, min(width, self.max_width))
        out = np.full((len(rows), width), self.pad_id, dtype=np.int64)
        start = 0 if prepend is None else 1
        for i, row in enumerate(rows):
            out[i, start : start + len(row)] = row
            if prepend is not None:
                out[i, 0] = prepend
            if append is not None:
                out[i, len(row)] = append
        return torch.from_numpy(out)

    def _packed(
        self, index: Tensor, sources: list[Sequence[int]], targets: list[Sequence[int]]
    ) -> PackedBatch:
        src, src_segments = self._concat(sources, append=self.eos_id)
        tgt_in, tgt_segments = self._concat(targets, prepend=self.bos_id)
        tgt_out, _ = self._concat(targets, append=self.eos_id)
        return PackedBatch(
            src=src,
            tgt_in=tgt_in,
            tgt_out=tgt_out,
            src_segments=src_segments,
            tgt_segments=tgt_segments,
            index=index,
            pad_id=self.pad_id,
            num_src_tokens=src_segments.tokens,
            num_target_tokens=tgt_segments.tokens,
        )

    @staticmethod
    def _concat(
        rows: list[Sequence[int]], *, prepend: int | None = None, append: int | None = None
    ) -> tuple[Tensor, Segments]:
        """(N,): the rows one after another, each with one special token before or after it; and their
        segments."""
        lengths = np.fromiter((len(row) + 1 for row in rows), dtype=np.int64, count=len(rows))
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        out = np.empty(int(offsets[-1]), dtype=np.int64)
        special, first = (prepend, 1) if prepend is not None else (append, 0)
        for row, begin, length in zip(rows, offsets[:-1].tolist(), lengths.tolist(), strict=True):
            out[begin + first : begin + first + length - 1] = row
            out[begin if first else begin + length - 1] = special
        return torch.from_numpy(out), Segments.of_lengths(torch.from_numpy(lengths))
