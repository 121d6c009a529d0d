"""The interface every model family offers to training and decoding.

Training calls ``forward`` (teacher forcing). Greedy and beam search only use ``encode``,
``start_decoding`` (``start_beams``, whose default builds on it) and ``decode_step`` plus
:meth:`DecoderState.reorder`, so a new family (the RNN baselines, say) works with every decoder unchanged.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from app.attention.segments import Segments


@dataclass
class EncoderOutput:
    memory: Tensor  # (B, S, D) encoder states
    mask: Tensor  # (B, S) True at real source tokens

    def take_rows(self, rows: Tensor) -> EncoderOutput:
        """The output for batch rows ``rows`` (B',), repeats allowed (beam search copies each K times)."""
        return EncoderOutput(memory=self.memory[rows], mask=self.mask[rows])


class DecoderState(ABC):
    """Whatever a model carries from one decoding step to the next (caches, recurrent state)."""

    @abstractmethod
    def reorder(self, index: Tensor) -> None:
        """Keep rows ``index`` (B',) of the batch, in that order; beam search prunes with it.

        Rows are only ever taken from the same sentence's group, so per-sentence data such as
        cross-attention keys may be left as they are.
        """

    @abstractmethod
    def select_rows(self, index: Tensor) -> None:
        """Keep rows ``index`` of the batch, per-sentence data included (drops finished sentences).

        Beam search keeps whole sentences: all K rows of each kept sentence, in order.
        """


class Seq2Seq(nn.Module, ABC):
    """An encoder-decoder translation model over token ids."""

    pad_id: int
    max_positions: int  # longest source or target the model accepts, in tokens incl. specials

    @abstractmethod
    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Logits (B, T, V) for target inputs ``tgt_in`` (B, T) given source ids ``src`` (B, S)."""

    def output_features(self, src: Tensor, tgt_in: Tensor) -> tuple[Tensor, nn.Linear] | None:
        """The states (B, T, D) the output layer reads, and that layer: ``forward`` is ``layer(states)``.

        Losses that fuse the output layer with the loss use it (``app.training.losses``); None (this
        default) where a model has no single output layer, and training computes ``forward``'s logits.
        """
        return None

    packs_batches = False  # whether the packed methods below take packed batches (data.layout=packed)

    def packed_output_features(
        self, src: Tensor, src_segments: Segments, tgt_in: Tensor, tgt_segments: Segments
    ) -> tuple[Tensor, nn.Linear]:
        """:meth:`output_features` of a packed batch (:mod:`app.attention.segments`): states (Nt, D) of the
        target inputs ``tgt_in`` (Nt,) given the sources ``src`` (Ns,), no padding anywhere; and the output
        layer. Only where ``packs_batches`` (the Transformer, :mod:`app.models.packed`)."""
        raise NotImplementedError(f"{type(self).__name__} does not take packed batches")

    def forward_packed(
        self, src: Tensor, src_segments: Segments, tgt_in: Tensor, tgt_segments: Segments
    ) -> Tensor:
        """Logits (Nt, V) of a packed batch (see :meth:`packed_output_features`)."""
        raise NotImplementedError(f"{type(self).__name__} does not take packed batches")

    @abstractmethod
    def encode(self, src: Tensor) -> EncoderOutput:
        """Encode source ids (B, S) once per sentence batch."""

    @abstractmethod
    def start_decoding(self, encoded: EncoderOutput) -> DecoderState:
        """A fresh decoder state for the batch ``encoded`` (caches empty, step 0)."""

    widens_beams = False  # whether :meth:`widen_beams` can widen a state after beam search's first step

    def start_beams(self, encoded: EncoderOutput, beams: int) -> DecoderState:
        """A decoder state with ``beams`` consecutive rows per sentence of ``encoded`` (beam search).

        This default copies each sentence's encoder output ``beams`` times; a model that can share
        per-sentence data across its rows (the Transformer's cross-attention keys) overrides it.
        """
        rows = torch.arange(encoded.memory.size(0), device=encoded.memory.device).repeat_interleave(beams)
        return self.start_decoding(encoded.take_rows(rows))  # (B*K,) rows, sentence by sentence

    def widen_beams(self, state: DecoderState, beams: int) -> None:
        """Turn ``state``, decoded with one row per sentence so far, into ``beams`` rows per sentence, as
        :meth:`start_beams` would have them after the same steps. Only where ``widens_beams``; elsewhere
        beam search decodes its first step with all K rows (K-1 of them copies of the first).
        """
        raise NotImplementedError(f"{type(self).__name__} cannot widen a decoder state to beams")

    @abstractmethod
    def decode_step(self, tokens: Tensor, state: DecoderState) -> Tensor:
        """Log-probabilities (B, V) of the next token after ``tokens`` (B,); updates ``state``."""

    def cross_attention(
        self, src: Tensor, tgt_in: Tensor, *, layer: int | None = None, head: int | None = None
    ) -> Tensor:
        """Attention weights (B, T, S) of target inputs ``tgt_in`` (B, T) over source ids ``src`` (B, S).

        Computed with teacher forcing (in eval mode, the weights search used for that output). ``layer``
        picks a decoder layer (None = the last), ``head`` one head (None = the mean over heads). Model
        families without attention weights keep this default, which says so.
        """
        raise ValueError(f"{type(self).__name__} does not expose attention weights")
