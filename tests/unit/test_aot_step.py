"""Decoding steps through AOTInductor packages (app.acceleration.aot_step) find what the model finds: one
sentence and several, greedy and beam, every source and cache length; shapes or setups a package cannot
take stay on the model's own code, alone.

Packages take seconds each to build, so the tests share them: one wrapped model for the module, and every
other model here has its weights, so its packages are found in the session's package cache."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable

import pytest
import torch
from helpers.attention_menu import attention_menu
from helpers.batches import random_sources
from helpers.decoding import BOS, VOCAB, assert_decodes_as, one_row_sources, search

from app.acceleration.aot_step import ExportedStep, standard_strides
from app.acceleration.decoding import CompiledDecoding, CompileReport, accelerate
from app.acceleration.step import CacheTensors, compile_available
from app.models import Transformer

pytestmark = [
    pytest.mark.usefixtures("single_torch_thread"),
    pytest.mark.skipif(compile_available() is not None, reason="inductor finds no C++ compiler here"),
]


def sharp_model(make_transformer: Callable[..., Transformer], attention: dict | None = None) -> Transformer:
    """The tiny model every test here decodes with (sharper distributions: outputs of varied lengths)."""
    model = make_transformer(
        src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, tie_embeddings=False, seed=1, attention=attention
    )
    with torch.no_grad():
        model.output.weight.mul_(3.0)
    return model


def packaged(model: Transformer) -> CompiledDecoding:
    fast, reason = accelerate(model)
    assert reason is None
    return fast


@pytest.fixture(scope="module")
def src() -> torch.Tensor:
    """8 right-padded sources of 2 to 9 tokens (EOS included)."""
    return random_sources(8, 2, 9, vocab=VOCAB)


@pytest.fixture(scope="module")
def model(make_transformer: Callable[..., Transformer]) -> Transformer:
    return sharp_model(make_transformer)


@pytest.fixture(scope="module")
def fast(model: Transformer) -> CompiledDecoding:
    return packaged(model)


def test_packaged_steps_equal_eager(model: Transformer, fast: CompiledDecoding, src: torch.Tensor) -> None:
    """Greedy and beam search, one sentence (a package per row count) and several (the sentence count
    symbolic): all as the model finds them."""
    for one in one_row_sources(src):
        assert_decodes_as(fast, model, one, beam=1)
    for one in one_row_sources(src)[:3]:
        assert_decodes_as(fast, model, one, beam=3)
    assert_decodes_as(fast, model, src, beam=3)  # several sentences
    assert_decodes_as(fast, model, src, beam=1)
    # (several sentences?, rows per sentence, cross-attention rows per sentence: the beams share keys)
    assert set(fast.steps.runners) == {(False, 1, 1), (False, 3, 1), (True, 3, 1), (True, 1, 1)}
    # (part, several sentences?): the encoder and the first step, packaged too (app.acceleration.aot_start)
    assert set(fast.start.runners) == {(p, n) for p in ("encoder", "first step") for n in (False, True)}
    report = CompileReport.of(fast)
    assert report.failure is None and report.packages == 8 and report.seconds > 0
    # called straight through the C++ runner (FlatRunner), not the package's tree-spec wrapper
    assert all(r.run is not None for r in [*fast.steps.runners.values(), *fast.start.runners.values()])
    assert gc.get_freeze_count() > 0  # the export's long-lived objects, out of later full collections


def test_a_second_model_with_the_same_weights_finds_its_packages_built(
    make_transformer: Callable[..., Transformer], fast: CompiledDecoding, src: torch.Tensor
) -> None:
    """The package cache (app.acceleration.aot_cache): a model built again, as a new process would, loads
    the first one's packages instead of compiling them, and decodes as eager; other weights compile anew."""
    search(fast, src, beam=1)  # built (or found) by the module's model
    again = sharp_model(make_transformer)
    fast_again = packaged(again)
    assert_decodes_as(fast_again, again, src, beam=1)
    report = CompileReport.of(fast_again)
    # the encoder, the first step and the steps of several sentences, then of the last one alone
    assert report.cache_hits == report.packages == 4
    other = sharp_model(make_transformer)
    with torch.no_grad():
        other.encoder[0].ffn[0].weight.mul_(-2.0)
        fast_other = packaged(other)
        encoded = fast_other.encode(src).memory  # one package (the encoder's) is enough to show it
        torch.testing.assert_close(encoded, other.encode(src).memory, atol=1e-5, rtol=1e-5)
    report = CompileReport.of(fast_other)
    assert report.cache_hits == 0 and report.packages == 1


def test_windowed_caches_stay_on_the_models_steps(
    make_transformer: Callable[..., Transformer], src: torch.Tensor
) -> None:
    model = sharp_model(make_transformer, attention_menu("sparse")["sparse"])
    fast = packaged(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_decodes_as(fast, model, one_row_sources(src)[0], beam=1)
    assert not fast.steps.runners  # a window trims its cache: never exported


def test_a_failing_export_leaves_the_steps_to_the_model(
    make_transformer: Callable[..., Transformer], src: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args, **kwargs):
        raise RuntimeError("this step does not export")

    model = make_transformer(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, seed=3)  # nothing in the cache
    fast = packaged(model)
    monkeypatch.setattr(torch.export, "export", refuse)
    with pytest.warns(UserWarning, match="not compiled ahead of time"):
        assert_decodes_as(fast, model, one_row_sources(src)[0], beam=1)
    assert "this step does not export" in fast.steps.failure


def test_a_shape_that_fails_to_export_leaves_the_other_shapes_packaged(
    model: Transformer, src: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The several-sentence step failing (as sdpa's once did) keeps one sentence's package in use."""
    forward = ExportedStep.forward

    def one_sentence_only(self, tokens, rows, memory, memory_mask, *caches):
        if memory.size(0) > 1:
            raise RuntimeError("several sentences do not export")
        return forward(self, tokens, rows, memory, memory_mask, *caches)

    fast = packaged(model)
    monkeypatch.setattr(ExportedStep, "forward", one_sentence_only)
    one = one_row_sources(src)[0]
    assert_decodes_as(fast, model, one, beam=1)
    with pytest.warns(UserWarning, match="several sentences do not export"):
        assert_decodes_as(fast, model, src, beam=1)
    assert fast.steps.failed == {(True, 1, 1)} and "several sentences" in fast.steps.failure
    runner, calls = fast.steps.runners[False, 1, 1], []
    monkeypatch.setattr(runner, "run", lambda tensors, run=runner.run: calls.append(1) or run(tensors))
    assert_decodes_as(fast, model, one, beam=1)
    assert calls  # one sentence's steps still through the package


def test_bf16_autocast_stays_on_the_models_steps(
    model: Transformer, fast: CompiledDecoding, src: torch.Tensor
) -> None:
    """The package computes in float32 as exported: under autocast (the torch-bf16 engine) it stands aside."""
    search(fast, one_row_sources(src)[0], beam=1)  # its packages built, or found
    runners = dict(fast.steps.runners)
    assert runners
    calls = []
    for key, runner in runners.items():
        fast.steps.runners[key] = lambda *a, runner=runner: calls.append(1) or runner(*a)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            found = search(fast, one_row_sources(src)[0], beam=1)
            expected = search(model, one_row_sources(src)[0], beam=1)
    finally:
        fast.steps.runners.update(runners)
    assert [h.tokens for hyps in found for h in hyps] == [h.tokens for hyps in expected for h in hyps]
    assert not calls


def test_standard_strides_copies_only_a_tensor_whose_strides_differ() -> None:
    plain = torch.randn(1, 4, 3, 8)
    assert standard_strides(plain) is plain
    view = torch.randn(1, 1, 4, 8).transpose(1, 2)  # (1, 4, 1, 8): contiguous, yet stride 32 along T
    assert view.is_contiguous() and view.stride() != (32, 8, 8, 1)
    fixed = standard_strides(view)
    assert fixed.stride() == (32, 8, 8, 1) and torch.equal(fixed, view)


def test_cache_tensors_read_held_gives_the_stored_rows_and_the_reorder(
    make_transformer: Callable[..., Transformer], src: torch.Tensor
) -> None:
    """``held``: the self caches as stored and the common held-back reorder as ``rows``; without ``held``,
    or where layers hold different reorders, the reorder is applied (and ``rows`` is None)."""
    model = make_transformer(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, seed=1).eval()
    with torch.no_grad():
        state = model.start_beams(model.encode(src), 2)
        rows = state.memory.size(0) * 2
        for _ in range(2):
            model.decode_step(torch.full((rows,), BOS), state)
    keep = torch.arange(rows).flip(0)
    state.reorder(keep)
    stored = [c.self_attn.held()[0] for c in state.caches]
    held = CacheTensors.read(state.caches, held=True)
    assert torch.equal(held.rows, keep) and all(k is s for k, s in zip(held.self_k, stored, strict=True))
    state.caches[0].self_attn.reorder(keep)  # layer 0 now holds another reorder than the others
    applied = CacheTensors.read(state.caches, held=True)
    assert applied.rows is None and torch.equal(applied.self_k[1], stored[1][keep])
