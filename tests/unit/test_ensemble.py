"""Tests for app.models.ensemble: several models decoding as one, against plain recomputation."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers.batches import random_sources
from helpers.models import TINY_TRANSFORMER
from helpers.rnn import tiny_rnn

from app.checkpoint import CheckpointError
from app.data.subword_training import train_or_load
from app.data.tokenizer import SubwordConfig, Tokenizer
from app.decoding import beam_hypotheses, greedy_hypotheses, output_limits
from app.inference.engine import SearchSettings
from app.inference.torch_engine import load_torch_engine
from app.models import Transformer
from app.models.ensemble import Ensemble, mean_probabilities
from app.models.seq2seq import Seq2Seq

pytestmark = pytest.mark.usefixtures("single_torch_thread")

PAD, BOS, EOS, VOCAB = 0, 2, 3, 40


@pytest.fixture(scope="module")
def members(make_transformer: Callable[..., Transformer]) -> list[Seq2Seq]:
    """Three different models over one vocabulary: two Transformers (one with GQA) and an RNN."""
    sharp = make_transformer(seed=1, tie_embeddings=False)
    with torch.no_grad():
        sharp.output.weight.mul_(3.0)  # confident enough that outputs end at varied lengths
    other = make_transformer(seed=2, attention={"kernel": "eager", "num_kv_heads": 2})
    return [sharp, other, tiny_rnn("luong_general", seed=3, max_positions=32)]


@pytest.fixture(scope="module")
def src() -> torch.Tensor:
    """8 right-padded sources of 3 to 9 tokens (EOS included)."""
    return random_sources(8, 3, 9, vocab=VOCAB)


@torch.no_grad()
def reference_token_log_probs(members: list[Seq2Seq], src: torch.Tensor, hyp: list[int]) -> list[float]:
    """log of the members' mean probability of each token of ``hyp`` and EOS, recomputed from scratch
    in float64 by teacher forcing every member on the whole prefix (no cache, no decoder state)."""
    tgt_in, tgt_out = torch.tensor([[BOS, *hyp]]), torch.tensor([[*hyp, EOS]])
    probs = [m(src[None], tgt_in).double().softmax(-1) for m in members]  # each (1, T, V)
    mean = torch.stack(probs).mean(dim=0)
    return mean.gather(-1, tgt_out[..., None])[0, :, 0].log().tolist()


def test_mean_probabilities_is_the_log_of_the_mean_probability() -> None:
    log_probs = [torch.randn(4, VOCAB, dtype=torch.float64).log_softmax(-1) for _ in range(3)]
    expected = torch.stack([lp.exp() for lp in log_probs]).mean(dim=0).log()
    torch.testing.assert_close(mean_probabilities(log_probs), expected)


def test_an_ensemble_of_one_decodes_like_its_model(members: list[Seq2Seq], src: torch.Tensor) -> None:
    limits = output_limits(src, PAD, max_len=20)
    common = {"bos_id": BOS, "eos_id": EOS, "limits": limits, "banned": (PAD, BOS)}
    alone = beam_hypotheses(members[0], src, beam_size=4, alpha=0.6, nbest=2, **common)
    ensembled = beam_hypotheses(Ensemble(members[:1]), src, beam_size=4, alpha=0.6, nbest=2, **common)
    for a, b in zip(alone, ensembled, strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_cached_ensemble_scores_equal_recomputation(
    members: list[Seq2Seq], src: torch.Tensor, search: str
) -> None:
    """Every token score of every hypothesis equals the mean distribution recomputed from scratch, so
    each member's cache follows beam search's reordering and pruning of rows."""
    ensemble = Ensemble(members)
    limits = output_limits(src, PAD, max_len=20)
    common = {"bos_id": BOS, "eos_id": EOS, "limits": limits, "banned": (PAD, BOS)}
    if search == "greedy":
        found = [[h] for h in greedy_hypotheses(ensemble, src, **common)]
    else:
        found = beam_hypotheses(ensemble, src, beam_size=3, alpha=0.0, nbest=3, **common)
    lengths = {len(h.tokens) for hyps in found for h in hyps}
    assert len(lengths) >= 3  # outputs end at varied lengths, so rows leave the batch at varied steps
    for row, hyps in enumerate(found):
        source = src[row][src[row] != PAD]
        for hyp in hyps:
            expected = reference_token_log_probs(members, source, hyp.tokens)
            assert hyp.token_scores == pytest.approx(expected[: len(hyp.token_scores)], abs=1e-4)


def test_ensemble_differs_from_each_member(members: list[Seq2Seq], src: torch.Tensor) -> None:
    """Averaging really mixes the members: the ensemble's distribution is none of theirs."""
    tgt_in = torch.full((src.size(0), 1), BOS)
    ensemble = Ensemble(members)(src, tgt_in)  # (B, 1, V) log-probabilities
    for member in members:
        assert not torch.allclose(ensemble, member(src, tgt_in).log_softmax(-1), atol=1e-3)


def test_ensemble_cross_attention_is_the_members_mean(
    make_transformer: Callable[..., Transformer], src: torch.Tensor
) -> None:
    pair = [make_transformer(seed=4), make_transformer(seed=5)]
    tgt_in = torch.tensor([[BOS, 7, 9]]).expand(src.size(0), -1)
    weights = Ensemble(pair).cross_attention(src, tgt_in)  # (B, T, S)
    expected = (pair[0].cross_attention(src, tgt_in) + pair[1].cross_attention(src, tgt_in)) / 2
    torch.testing.assert_close(weights, expected)
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:2]))


def test_members_must_agree_on_padding(make_transformer: Callable[..., Transformer]) -> None:
    with pytest.raises(ValueError, match="padding id"):
        Ensemble([make_transformer(pad_id=0), make_transformer(pad_id=1)])
    with pytest.raises(ValueError, match="at least one"):
        Ensemble([])


@pytest.fixture(scope="module")
def two_checkpoints(
    checkpoint_factory: Callable[..., torch.nn.Module], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("ensemble")
    paths = directory / "a.ckpt", directory / "b.ckpt"
    for seed, path in enumerate(paths):
        checkpoint_factory(path, model_cfg=TINY_TRANSFORMER, attention_cfg={"kernel": "eager"}, seed=seed)
    return paths


def test_load_translator_builds_an_ensemble_of_checkpoints(
    two_checkpoints: tuple[Path, Path], multi30k_slice: tuple[list[str], list[str]]
) -> None:
    first, second = two_checkpoints
    translator, config = load_torch_engine(first, ensemble=[second])
    assert isinstance(translator.model, Ensemble) and len(translator.model.members) == 2
    assert config["model"] == TINY_TRANSFORMER
    sentences = ["", *multi30k_slice[0][:5], "   "]
    outputs = translator.translate(sentences, SearchSettings(beam=3, max_len=12))
    assert len(outputs) == len(sentences) and outputs[0] == "" and outputs[-1] == ""


def test_members_with_different_vocabularies_are_refused_naming_both(
    two_checkpoints: tuple[Path, Path],
    checkpoint_factory: Callable[..., torch.nn.Module],
    multi30k_slice: tuple[list[str], list[str]],
    tmp_path: Path,
) -> None:
    src, tgt = multi30k_slice
    smaller: Tokenizer = train_or_load(
        src_texts=src,
        tgt_texts=tgt,
        config=SubwordConfig(vocab_size=150),
        cache_dir=tmp_path / "spm",
        corpus_key="m30k-test-150",
    )[0]
    other = tmp_path / "other_vocab.ckpt"
    checkpoint_factory(other, smaller, model_cfg=TINY_TRANSFORMER, attention_cfg={"kernel": "eager"})
    with pytest.raises(CheckpointError, match=r"a\.ckpt and .*other_vocab\.ckpt.*200 and 150 pieces"):
        load_torch_engine(two_checkpoints[0], ensemble=[other])


def test_log_of_mean_not_mean_of_logs() -> None:
    """Two members sure of different tokens give each half the probability, not a geometric blend."""
    a = torch.tensor([[0.0, -math.inf]])
    b = torch.tensor([[-math.inf, 0.0]])
    torch.testing.assert_close(mean_probabilities([a, b]).exp(), torch.tensor([[0.5, 0.5]]))
