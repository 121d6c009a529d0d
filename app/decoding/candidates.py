"""The 2K best continuations of every sentence in beam search, without sorting K x V scores.

A beam step ranks, for each sentence, K rows of V log-probabilities, each row shifted by its beam's
score. ``topk`` over the K*V flat scores is the search's costliest operation after the model itself
(at batch 64, beam 5 and 8,000 subwords, ~3 ms a step on one core, as much as two of the decoder's
layers) and it needs the shifted K x V scores written out first. The same candidates come cheaper in
two rounds: split each row into chunks of C subwords and take every chunk's maximum (one pass over
the scores, nothing written); the W best candidates of a sentence lie in its W best chunks (a
candidate's chunk has a maximum at least as high, and at most W chunks can hold values at least as
high as the W-th best); so only W chunks of C scores are ranked exactly. Equal scores are the one
place where the two may pick differently, as ``topk`` itself promises no order among ties.
"""

from __future__ import annotations

import torch
from torch import Tensor

CHUNK_RANGE = (64, 256)  # chunk widths tried: wide enough that W chunks are few, short enough to rank


def chunk_width(vocab: int) -> int | None:
    """The chunk width for rows of ``vocab`` scores: the largest divisor of ``vocab`` in ``CHUNK_RANGE``,
    a multiple of 16 where one exists (whole vector registers), or None (rank the rows directly)."""
    low, high = CHUNK_RANGE
    divisors = [c for c in range(high, low - 1, -1) if vocab % c == 0]
    aligned = [c for c in divisors if c % 16 == 0]
    return (aligned or divisors or [None])[0]


def top_candidates(scores: Tensor, log_probs: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """The 2K best continuations per sentence, best first: (scores, source beam, token), each (B, 2K).

    ``scores`` (B, R) are the beams' summed log-probabilities, ``log_probs`` (B*R, V) the next token's: R
    rows per sentence, K of them, or 1 on the first step, when a sentence's K beams are still one.
    """
    vocab, rows = log_probs.size(-1), scores.size(1)
    width = min(2 * k, rows * vocab)
    chunk = chunk_width(vocab)
    if chunk is None or rows * (vocab // chunk) < width:
        return ranked_directly(scores, log_probs, width)
    return ranked_by_chunks(scores, log_probs, width, chunk)


def ranked_directly(scores: Tensor, log_probs: Tensor, width: int) -> tuple[Tensor, Tensor, Tensor]:
    """``topk`` over all R*V shifted scores of each sentence (``scores`` (B, R), ``log_probs`` (B*R, V))."""
    (batch, rows), vocab = scores.shape, log_probs.size(-1)
    total = scores[:, :, None] + log_probs.view(batch, rows, vocab)  # (B, R, V)
    cand_scores, flat = total.view(batch, -1).topk(width, dim=1)
    return cand_scores, flat // vocab, flat % vocab


def ranked_by_chunks(
    scores: Tensor, log_probs: Tensor, width: int, chunk: int
) -> tuple[Tensor, Tensor, Tensor]:
    """``topk`` over the ``width`` best chunks of each sentence (see the module's docstring)."""
    (batch, k), vocab = scores.shape, log_probs.size(-1)  # k: rows per sentence
    per_row = vocab // chunk
    maxima = log_probs.view(batch, k, per_row, chunk).amax(-1) + scores[:, :, None]  # (B, R, V/C)
    best = maxima.view(batch, -1).topk(width, dim=1).indices  # (B, W) chunk ids: beam * V/C + chunk
    beam = best // per_row  # (B, W)
    rows = torch.arange(batch, device=scores.device)[:, None] * k + beam  # (B, W) rows of log_probs
    tokens = (best % per_row)[:, :, None] * chunk + torch.arange(chunk, device=scores.device)  # (B, W, C)
    shifted = log_probs[rows[:, :, None], tokens] + scores.gather(1, beam)[:, :, None]  # (B, W, C)
    cand_scores, pos = shifted.view(batch, -1).topk(width, dim=1)  # (B, W) positions among W*C
    return cand_scores, beam.gather(1, pos // chunk), tokens.view(batch, -1).gather(1, pos)
