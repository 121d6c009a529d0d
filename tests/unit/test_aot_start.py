"""The encoder and the first decoding step through AOTInductor packages (app.acceleration.aot_start) compute
what the model's own do: the encoder's memory (zero at the padding) and mask, the first step's
log-probabilities and every cache it fills; a part that cannot be packaged stays eager, alone. The models
have the weights of test_aot_step's: their packages are found in the session's cache."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from helpers.batches import random_sources

from app.acceleration.aot_start import ExportedEncoder
from app.acceleration.decoding import CompiledDecoding, CompileReport, accelerate
from app.acceleration.step import compile_available
from app.models import Transformer

pytestmark = [
    pytest.mark.usefixtures("single_torch_thread"),
    pytest.mark.skipif(compile_available() is not None, reason="inductor finds no C++ compiler here"),
]

PAD, BOS, VOCAB = 0, 2, 20


def aot_model(
    make_transformer: Callable[..., Transformer], attention: dict
) -> tuple[Transformer, CompiledDecoding]:
    """test_aot_step's model (seed 1, sharpened output), and it wrapped with packages."""
    model = make_transformer(
        src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, tie_embeddings=False, seed=1, attention=attention
    )
    with torch.no_grad():
        model.output.weight.mul_(3.0)
    fast, reason = accelerate(model)
    assert reason is None
    return model, fast


def first_step(
    model: Transformer | CompiledDecoding, src: torch.Tensor
) -> tuple[torch.Tensor, list, torch.Tensor]:
    """The first step's log-probabilities, its filled caches and the memory, through ``model.encode``
    and ``model.decode_step``."""
    encoded = model.encode(src)
    state = model.start_decoding(encoded)
    log_probs = model.decode_step(torch.full((src.size(0),), BOS), state)
    assert state.step == 1
    return log_probs, state.caches, encoded.memory


@pytest.mark.parametrize("sentences", [1, 5])
def test_packaged_encoder_and_first_step_equal_eager(
    make_transformer: Callable[..., Transformer], sentences: int
) -> None:
    model, fast = aot_model(make_transformer, {"kernel": "eager"})
    src = random_sources(sentences, 2, 9, vocab=VOCAB)  # right-padded where several
    with torch.no_grad():
        packaged = first_step(fast, src)
        assert set(fast.start.runners) == {("encoder", sentences > 1), ("first step", sentences > 1)}
        eager = first_step(model, src)
    (log_probs, caches, memory), (eager_log_probs, eager_caches, eager_memory) = packaged, eager
    torch.testing.assert_close(memory, eager_memory, atol=1e-5, rtol=1e-5)
    assert not memory[src == PAD].any()  # zero at the padding, as the packed eager encoder leaves it
    torch.testing.assert_close(log_probs, eager_log_probs, atol=1e-5, rtol=1e-5)
    for cache, expected in zip(caches, eager_caches, strict=True):
        for site in ("self_attn", "cross_attn"):
            got, want = getattr(cache, site), getattr(expected, site)
            torch.testing.assert_close(got.k, want.k, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(got.v, want.v, atol=1e-5, rtol=1e-5)
            assert type(got) is type(want) and getattr(got, "pending", None) is None


def test_an_encoder_that_fails_to_export_stays_eager_alone(
    make_transformer: Callable[..., Transformer], monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(self, src, index=None):
        raise RuntimeError("this encoder does not export")

    model, fast = aot_model(make_transformer, {"kernel": "eager"})
    monkeypatch.setattr(ExportedEncoder, "forward", refuse)
    src = random_sources(3, 2, 9, vocab=VOCAB)
    with torch.no_grad(), pytest.warns(UserWarning, match="the encoder not compiled ahead of time"):
        _, _, memory = first_step(fast, src)
    assert "this encoder does not export" in fast.start.failures["encoder"]
    assert set(fast.start.runners) == {("first step", True)}  # the first step still packaged
    assert "this encoder does not export" in CompileReport.of(fast).failure
    with torch.no_grad():
        torch.testing.assert_close(memory, model.encode(src).memory)


def test_the_first_step_of_a_windowed_cache_stays_eager(make_transformer: Callable[..., Transformer]) -> None:
    """A sliding window trims its cache (no later step is packaged): its first step is not packaged either."""
    window = {"kernel": "sparse", "options": {"pattern": "sliding_window", "window": 4}}
    attention = {"kernel": "eager", "sites": {"decoder_self": window}}
    model, fast = aot_model(make_transformer, attention)
    src = random_sources(1, 2, 9, vocab=VOCAB)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        state = model.start_decoding(model.encode(src))  # the encoder's own: no package to build here
        assert fast.start.first_step(torch.full((1,), BOS), state) is None  # declined before any export
    assert not fast.start.runners


def test_an_encoder_with_random_features_is_packaged(make_transformer: Callable[..., Transformer]) -> None:
    """FAVOR's features are drawn at first use from a seeded generator, which a package cannot do: an
    eager call before the export draws them, so they go in as constants. With several sentences inductor's
    freezing fails on that graph, and the package is built without it. The decoder's recurrent state keeps
    the first step eager."""
    favor = {"kernel": "linear", "options": {"feature_map": "favor", "num_features": 16}}
    model, fast = aot_model(make_transformer, favor)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing falls back
        src = random_sources(4, 2, 9, vocab=VOCAB)
        packaged = fast.encode(src).memory
        torch.testing.assert_close(packaged, model.encode(src).memory, atol=1e-5, rtol=1e-5)
    assert set(fast.start.runners) == {("encoder", True)}
