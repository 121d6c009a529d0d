"""Beam search's candidate ranking: the chunked top-k picks what a plain top-k over K*V scores picks."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import app.decoding.candidates as candidates
from app.decoding import beam_search, output_limits
from app.decoding.candidates import chunk_width, ranked_directly, top_candidates
from app.models import Transformer

pytestmark = pytest.mark.usefixtures("single_torch_thread")


@pytest.mark.parametrize(
    ("vocab", "expected"),
    [(8000, 160), (32000, 256), (1000, 250), (8191, None), (40, None), (64, 64)],
)
def test_chunk_width_is_a_divisor_in_range_aligned_where_possible(vocab: int, expected: int | None) -> None:
    assert chunk_width(vocab) == expected


def shifted_scores(batch: int, k: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Beam scores (B, K) and next-token log-probabilities (B*K, V) with distinct values."""
    gen = torch.Generator().manual_seed(seed)
    log_probs = torch.log_softmax(3 * torch.randn(batch * k, vocab, generator=gen, dtype=torch.float64), -1)
    scores = -5 * torch.rand(batch, k, generator=gen, dtype=torch.float64)
    return scores, log_probs


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("k", "vocab"), [(1, 640), (2, 1000), (5, 8000), (12, 256)])
def test_chunked_ranking_equals_ranking_every_score(seed: int, k: int, vocab: int) -> None:
    scores, log_probs = shifted_scores(7, k, vocab, seed)
    assert chunk_width(vocab) is not None
    chunked = top_candidates(scores, log_probs, k)
    direct = ranked_directly(scores, log_probs, min(2 * k, k * vocab))
    for got, want in zip(chunked, direct, strict=True):
        assert torch.equal(got, want)


def test_one_best_beam_dominating_keeps_all_candidates_in_its_row() -> None:
    """Every candidate from one row: the chunk maxima of the others never displace them."""
    scores, log_probs = shifted_scores(3, 4, 512, seed=0)
    scores[:, 0] = 0.0
    scores[:, 1:] = -1e6
    cand_scores, beam, token = top_candidates(scores, log_probs, 4)
    assert beam.eq(0).all()
    want_scores, want_tokens = log_probs.view(3, 4, 512)[:, 0].topk(8, dim=1)
    assert torch.equal(cand_scores, want_scores) and torch.equal(token, want_tokens)


def test_dead_beams_and_banned_tokens_rank_finite_candidates_first() -> None:
    """The first step (one live beam) at a length limit (only EOS allowed): the finite candidates come
    first, exactly as a plain top-k ranks them; the rest are -inf, like the plain top-k's."""
    k, vocab, eos = 5, 1024, 3
    scores, log_probs = shifted_scores(2, k, vocab, seed=1)
    scores[:, 1:] = float("-inf")
    log_probs[1::k] = float("-inf")  # the second beam of each sentence: every token banned
    log_probs[::k, eos + 1 :] = float("-inf")  # the first beam: only ids 0..EOS allowed
    cand_scores, _, token = top_candidates(scores, log_probs, k)
    want_scores, _, want_tokens = ranked_directly(scores, log_probs, 2 * k)
    finite = torch.isfinite(want_scores)
    assert finite.sum(dim=1).tolist() == [eos + 1, eos + 1]
    assert torch.equal(cand_scores[finite], want_scores[finite])
    assert torch.equal(token[finite], want_tokens[finite])
    assert torch.isinf(cand_scores[~finite]).all()


def test_beam_search_outputs_are_the_same_with_and_without_chunks(
    make_transformer: Callable[..., Transformer], monkeypatch: pytest.MonkeyPatch
) -> None:
    vocab = 640  # chunks of 128
    model = make_transformer(src_vocab_size=vocab, tgt_vocab_size=vocab, tie_embeddings=False, seed=3)
    with torch.no_grad():
        model.output.weight.mul_(3.0)
    src = torch.randint(4, vocab, (6, 9))
    src[:, -1] = 3
    common = {"beam_size": 4, "bos_id": 2, "eos_id": 3, "limits": output_limits(src, 0, max_len=20)}
    chunked = beam_search(model, src, banned=(0, 2), **common)
    monkeypatch.setattr(candidates, "chunk_width", lambda vocab: None)
    assert beam_search(model, src, banned=(0, 2), **common) == chunked


@pytest.mark.parametrize("vocab", [640, 8000])
def test_the_first_step_ranks_one_row_as_its_k_copies(vocab: int) -> None:
    """Before the first step a sentence's K beams are one (the others score -inf): ranking its one row gives
    the candidates that ranking the K copies gives."""
    k = 5
    scores, log_probs = shifted_scores(3, 1, vocab, seed=2)  # (B, 1), (B, V)
    dead = torch.full((3, k - 1), float("-inf"), dtype=scores.dtype)
    one = top_candidates(scores, log_probs, k)
    copies = top_candidates(torch.cat([scores, dead], dim=1), log_probs.repeat_interleave(k, dim=0), k)
    assert one[1].eq(0).all() and copies[1].eq(0).all()  # every candidate from the live beam
    assert torch.equal(one[0], copies[0]) and torch.equal(one[2], copies[2])
