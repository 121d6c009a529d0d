"""Several trained models decoding as one: the mean of their next-token distributions.

An ensemble is a :class:`~app.models.seq2seq.Seq2Seq` like any other, so greedy search, beam search,
sampling, n-best lists and scoring use it unchanged. Every member encodes the source itself and keeps
its own decoder state; at each step the members' probabilities are averaged (in log space, stably):

    log p(y | x) = logsumexp_m log p_m(y | x) - log M

Members may differ in anything (size, attention, family) except the vocabulary, which they must share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from app.models.seq2seq import DecoderState, EncoderOutput, Seq2Seq


@dataclass
class EnsembleEncoding(EncoderOutput):
    """Every member's encoder output; ``memory``/``mask`` are the first member's (for shapes)."""

    members: tuple[EncoderOutput, ...] = ()

    @classmethod
    def of(cls, members: tuple[EncoderOutput, ...]) -> EnsembleEncoding:
        return cls(memory=members[0].memory, mask=members[0].mask, members=members)

    def take_rows(self, rows: Tensor) -> EnsembleEncoding:
        return EnsembleEncoding.of(tuple(m.take_rows(rows) for m in self.members))


class EnsembleState(DecoderState):
    """One decoder state per member, pruned and reordered together."""

    def __init__(self, states: list[DecoderState]) -> None:
        self.states = states

    def reorder(self, index: Tensor) -> None:
        for state in self.states:
            state.reorder(index)

    def select_rows(self, index: Tensor) -> None:
        for state in self.states:
            state.select_rows(index)


def mean_probabilities(log_probs: list[Tensor]) -> Tensor:
    """log of the mean of the members' probabilities, from their log-probabilities (M x (..., V))."""
    return torch.stack(log_probs).logsumexp(dim=0) - math.log(len(log_probs))


class Ensemble(Seq2Seq):
    """Members that share one vocabulary, averaged per output token (see the module docstring)."""

    def __init__(self, members: list[Seq2Seq]) -> None:
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one model")
        pads = {m.pad_id for m in members}
        if len(pads) != 1:
            raise ValueError(f"ensemble members disagree on the padding id: {sorted(pads)}")
        self.members = nn.ModuleList(members)
        self.pad_id = members[0].pad_id
        self.max_positions = min(m.max_positions for m in members)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Log-probabilities (B, T, V) of the averaged distribution; as logits they give that distribution."""
        return mean_probabilities([m(src, tgt_in).float().log_softmax(-1) for m in self.members])

    def encode(self, src: Tensor) -> EnsembleEncoding:
        return EnsembleEncoding.of(tuple(m.encode(src) for m in self.members))

    def start_decoding(self, encoded: EncoderOutput) -> EnsembleState:
        if not isinstance(encoded, EnsembleEncoding):
            raise TypeError("an ensemble decodes from its own encode(), not a single model's output")
        return EnsembleState(
            [m.start_decoding(e) for m, e in zip(self.members, encoded.members, strict=True)]
        )

    def start_beams(self, encoded: EncoderOutput, beams: int) -> EnsembleState:
        if not isinstance(encoded, EnsembleEncoding):
            raise TypeError("an ensemble decodes from its own encode(), not a single model's output")
        return EnsembleState(
            [m.start_beams(e, beams) for m, e in zip(self.members, encoded.members, strict=True)]
        )

    def decode_step(self, tokens: Tensor, state: EnsembleState) -> Tensor:
        return mean_probabilities(
            [m.decode_step(tokens, s) for m, s in zip(self.members, state.states, strict=True)]
        )

    def cross_attention(
        self, src: Tensor, tgt_in: Tensor, *, layer: int | None = None, head: int | None = None
    ) -> Tensor:
        """The members' cross-attention maps (B, T, S), averaged (each row still sums to 1)."""
        maps = [m.cross_attention(src, tgt_in, layer=layer, head=head) for m in self.members]
        return torch.stack([w.float() for w in maps]).mean(dim=0)
