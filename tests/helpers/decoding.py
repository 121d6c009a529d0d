"""Decoding the same sources twice, through a compiled wrapper and through the plain model, for the tests
of :mod:`app.acceleration`: greedy outputs must be identical, beam hypotheses the same with scores within
float rounding (fused kernels sum in another order)."""

from __future__ import annotations

import pytest
import torch

from app.decoding import output_limits
from app.decoding.beam import beam_hypotheses
from app.decoding.greedy import greedy_hypotheses
from app.models.seq2seq import Seq2Seq

PAD, BOS, EOS, VOCAB = 0, 2, 3, 20


def search(model: Seq2Seq, src: torch.Tensor, *, beam: int) -> list:
    """Hypotheses of ``model`` for ``src``: greedy (beam 1, one each) or beam search (n-best = beam)."""
    limits = output_limits(src, PAD, max_len=12, ratio=1.5, extra=2)
    common = {"bos_id": BOS, "eos_id": EOS, "limits": limits, "banned": (PAD, BOS)}
    with torch.no_grad():
        if beam == 1:
            return [[h] for h in greedy_hypotheses(model, src, **common)]
        return beam_hypotheses(model, src, beam_size=beam, nbest=beam, **common)


def assert_same_hypotheses(compiled: list, eager: list) -> None:
    """Same tokens in the same order; scores equal up to float rounding."""
    assert [[h.tokens for h in hyps] for hyps in compiled] == [[h.tokens for h in hyps] for hyps in eager]
    for found, expected in zip(compiled, eager, strict=True):
        assert [h.score for h in found] == pytest.approx([h.score for h in expected], abs=1e-4)


def assert_decodes_as(fast: Seq2Seq, model: Seq2Seq, src: torch.Tensor, *, beam: int) -> None:
    """``fast`` (``model`` wrapped by :func:`~app.acceleration.decoding.accelerate`) finds what ``model``
    finds for ``src``."""
    assert_same_hypotheses(search(fast, src, beam=beam), search(model, src, beam=beam))


def one_row_sources(src: torch.Tensor) -> list[torch.Tensor]:
    """Each source alone, unpadded (batch 1)."""
    return [row[: int((row != PAD).sum())][None] for row in src]
