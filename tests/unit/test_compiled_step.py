"""Compiled decoding steps (torch.compile, inductor) give eager decoding's outputs, or fall back to eager.

Greedy outputs must be identical and beam hypotheses the same with scores within float rounding, for the
kernels that compile; a kernel or setup that cannot compile must decode eagerly with the same outputs.
Compiling takes seconds per graph, so the sweep over every kernel is marked slow.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable

import pytest
import torch
from helpers.attention_menu import attention_menu
from helpers.batches import random_sources

from app.acceleration.aot_step import ExportedStep, standard_strides
from app.acceleration.compiled_step import (
    CacheTensors,
    CompiledSteps,
    compile_available,
    compile_decoding,
    own_code,
)
from app.decoding import output_limits
from app.decoding.beam import beam_hypotheses
from app.decoding.greedy import greedy_hypotheses
from app.models import Transformer

pytestmark = [
    pytest.mark.usefixtures("single_torch_thread"),
    pytest.mark.skipif(compile_available() is not None, reason="inductor finds no C++ compiler here"),
]

PAD, BOS, EOS, VOCAB = 0, 2, 3, 20

KERNELS = attention_menu("eager", "sdpa_gqa", "flash", "sparse", "linformer", "linear", "lsh_shared_qk")


def decode_both(model: Transformer, src: torch.Tensor, *, beam: int) -> tuple[list, list]:
    """Hypotheses of the compiled steps, then of the eager ones, for the same sources."""
    limits = output_limits(src, PAD, max_len=12, ratio=1.5, extra=2)
    common = {"bos_id": BOS, "eos_id": EOS, "limits": limits, "banned": (PAD, BOS)}

    def search() -> list:
        if beam == 1:
            return [[h] for h in greedy_hypotheses(model, src, **common)]
        return beam_hypotheses(model, src, beam_size=beam, nbest=beam, **common)

    compiled = search()
    runner, model.compiled_steps = model.compiled_steps, None
    try:
        eager = search()
    finally:
        model.compiled_steps = runner
    return compiled, eager


def assert_same_hypotheses(compiled: list, eager: list) -> None:
    """Same tokens in the same order; scores equal up to float rounding (fused kernels sum differently)."""
    assert [[h.tokens for h in hyps] for hyps in compiled] == [[h.tokens for h in hyps] for hyps in eager]
    for found, expected in zip(compiled, eager, strict=True):
        assert [h.score for h in found] == pytest.approx([h.score for h in expected], abs=1e-4)


@pytest.fixture(scope="module")
def src() -> torch.Tensor:
    """8 right-padded sources of 2 to 9 tokens (EOS included)."""
    return random_sources(8, 2, 9, vocab=VOCAB)


def compiled_model(make_transformer: Callable[..., Transformer], attention: dict) -> Transformer:
    model = make_transformer(
        src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, tie_embeddings=False, seed=1, attention=attention
    )
    with torch.no_grad():
        model.output.weight.mul_(3.0)  # sharper distributions: outputs of varied lengths
    assert compile_decoding(model, "on") is None
    return model


def test_compiled_greedy_and_beam_equal_eager(
    make_transformer: Callable[..., Transformer], src: torch.Tensor
) -> None:
    model = compiled_model(make_transformer, {"kernel": "sdpa"})
    for beam in (1, 3):
        assert_same_hypotheses(*decode_both(model, src, beam=beam))
    one = src[:1, : int((src[0] != PAD).sum())]  # batch 1: a graph of its own (sizes of 1 specialize)
    assert_same_hypotheses(*decode_both(model, one, beam=1))
    runner = model.compiled_steps
    assert runner.failure is None
    assert runner.graphs >= 2 and runner.seconds > 0  # compile time kept apart


@pytest.mark.slow
@pytest.mark.parametrize("name", list(KERNELS))
def test_every_kernel_compiles_or_falls_back_with_eager_outputs(
    make_transformer: Callable[..., Transformer], src: torch.Tensor, name: str
) -> None:
    model = compiled_model(make_transformer, KERNELS[name])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a kernel that falls back says why in a warning
        for beam in (1, 3):
            assert_same_hypotheses(*decode_both(model, src, beam=beam))
    runner = model.compiled_steps
    if name == "linear":  # recurrent state, not a KV cache: never handed to the compiled step
        assert runner.graphs == 0 and runner.failure is None


def test_a_failing_compilation_falls_back_to_eager(
    make_transformer: Callable[..., Transformer], src: torch.Tensor
) -> None:
    def broken_backend(graph: torch.fx.GraphModule, inputs: list) -> Callable:
        raise RuntimeError("this backend lowers nothing")

    model = compiled_model(make_transformer, {"kernel": "eager"})
    runner = model.compiled_steps
    runner.compiled = torch.compile(
        own_code(runner.step), backend=broken_backend
    )  # as inductor failing would
    with pytest.warns(UserWarning, match="decoding stays eager"):
        compiled, eager = decode_both(model, src, beam=1)
    assert_same_hypotheses(compiled, eager)
    assert "this backend lowers nothing" in runner.failure


def test_each_model_keeps_its_own_graphs(make_transformer: Callable[..., Transformer]) -> None:
    """Dynamo caches graphs per code object: two models must not share (and fill) one cache."""
    first, second = (make_transformer(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB) for _ in range(2))
    for model in (first, second):
        compile_decoding(model, "on")
    first_code = first.compiled_steps.compiled.__wrapped__.__func__.__code__
    assert first_code is not second.compiled_steps.compiled.__wrapped__.__func__.__code__
    assert torch._dynamo.config.recompile_limit >= 32


def test_compile_modes(make_transformer: Callable[..., Transformer]) -> None:
    model = make_transformer(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB)
    with pytest.raises(ValueError, match="not one of auto, on, aot, off"):
        compile_decoding(model, "yes")
    assert compile_decoding(model, "auto") is None  # on the CPU: compiles
    assert isinstance(model.compiled_steps, CompiledSteps)
    assert compile_decoding(model, "off") == "compile=off"
    assert model.compiled_steps is None


def test_training_and_gradients_keep_the_eager_step(make_transformer: Callable[..., Transformer]) -> None:
    model = make_transformer(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB)
    compile_decoding(model, "on")
    src = random_sources(2, 3, 5, vocab=VOCAB)
    state = model.start_decoding(model.encode(src))
    tokens = torch.full((2,), BOS)
    model.decode_step(tokens, state)  # step 0 fills the caches
    assert model.compiled_steps(tokens, state) is None  # gradients on: eager
    with torch.no_grad():
        model.train()
        assert model.compiled_steps(tokens, state) is None
        model.eval()
    assert model.compiled_steps.graphs == 0


def test_weights_changed_or_replaced_after_compiling_are_used(
    make_transformer: Callable[..., Transformer], src: torch.Tensor
) -> None:
    """Guards skip unchanged module subtrees (recursive dict tags): a weight written in place is read at
    run time, and a parameter replaced by another changes its module's dict, so the step is guarded anew."""
    model = compiled_model(make_transformer, {"kernel": "eager"})
    assert_same_hypotheses(*decode_both(model, src, beam=1))
    assert torch._dynamo.config.use_recursive_dict_tags_for_guards
    ffn = model.decoder[0].ffn[0]
    with torch.no_grad():
        ffn.weight.mul_(-2.0)  # in place, as load_state_dict writes
    assert_same_hypotheses(*decode_both(model, src, beam=1))
    ffn.weight = torch.nn.Parameter(torch.randn_like(ffn.weight))  # a new parameter object
    compiled, eager = decode_both(model, src, beam=1)
    assert_same_hypotheses(compiled, eager)
    assert model.compiled_steps.failure is None


def aot_model(make_transformer: Callable[..., Transformer], attention: dict) -> Transformer:
    model = compiled_model(make_transformer, attention)
    assert compile_decoding(model, "aot") is None
    return model


def one_row_sources(src: torch.Tensor) -> list[torch.Tensor]:
    """Each source alone, unpadded (batch 1)."""
    return [row[: int((row != PAD).sum())][None] for row in src]


def test_aot_steps_equal_eager(make_transformer: Callable[..., Transformer], src: torch.Tensor) -> None:
    """Greedy and beam search through the AOTInductor packages, one sentence (a package per row count) and
    several (the sentence count symbolic), every source and cache length: all as eager."""
    model = aot_model(make_transformer, {"kernel": "eager"})
    for one in one_row_sources(src):
        assert_same_hypotheses(*decode_both(model, one, beam=1))
    for one in one_row_sources(src)[:3]:
        assert_same_hypotheses(*decode_both(model, one, beam=3))
    assert_same_hypotheses(*decode_both(model, src, beam=3))  # several sentences
    assert_same_hypotheses(*decode_both(model, src, beam=1))
    ahead = model.compiled_steps.ahead
    # (several sentences?, rows per sentence, cross-attention rows per sentence: the beams share keys)
    assert set(ahead.runners) == {(False, 1, 1), (False, 3, 1), (True, 3, 1), (True, 1, 1)}
    # (part, several sentences?): the encoder and the first step, packaged too (app.acceleration.aot_start)
    assert set(ahead.start.runners) == {(p, n) for p in ("encoder", "first step") for n in (False, True)}
    assert ahead.failure_report is None and ahead.seconds > 0
    # called straight through the C++ runner (FlatRunner), not the package's tree-spec wrapper
    assert all(r.run is not None for r in [*ahead.runners.values(), *ahead.start.runners.values()])
    assert gc.get_freeze_count() > 0  # the export's long-lived objects, out of later full collections


def test_a_second_model_with_the_same_weights_finds_its_packages_built(
    make_transformer: Callable[..., Transformer], src: torch.Tensor
) -> None:
    """The package cache (app.acceleration.aot_cache): a model built again, as a new process would, loads the
    first one's packages instead of compiling them, and decodes as eager; other weights compile anew."""
    first = aot_model(make_transformer, {"kernel": "eager"})
    assert_same_hypotheses(*decode_both(first, src, beam=1))
    again = aot_model(make_transformer, {"kernel": "eager"})
    again.load_state_dict(first.state_dict())
    assert_same_hypotheses(*decode_both(again, src, beam=1))
    assert again.compiled_steps.ahead.cache_hits == again.compiled_steps.ahead.packages >= 3
    other = aot_model(make_transformer, {"kernel": "eager"})
    with torch.no_grad():
        other.encoder[0].ffn[0].weight.mul_(-2.0)
        packaged = other.encode(src).memory  # one package (the encoder's) is enough to show it
        torch.testing.assert_close(packaged, other.encode(src).memory, atol=1e-5, rtol=1e-5)
    assert other.compiled_steps.ahead.cache_hits == 0 and other.compiled_steps.ahead.packages == 1


def test_aot_leaves_windowed_caches_to_the_other_steps(
    make_transformer: Callable[..., Transformer], src: torch.Tensor
) -> None:
    model = aot_model(make_transformer, KERNELS["sparse"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_same_hypotheses(*decode_both(model, one_row_sources(src)[0], beam=1))
    assert not model.compiled_steps.ahead.runners  # a window trims its cache: never exported


def test_a_failing_export_leaves_one_row_steps_to_the_other_path(
    make_transformer: Callable[..., Transformer], src: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args, **kwargs):
        raise RuntimeError("this step does not export")

    model = aot_model(make_transformer, {"kernel": "eager"})
    monkeypatch.setattr(torch.export, "export", refuse)
    with pytest.warns(UserWarning, match="not compiled ahead of time"):
        compiled, eager = decode_both(model, one_row_sources(src)[0], beam=1)
    assert_same_hypotheses(compiled, eager)
    assert "this step does not export" in model.compiled_steps.ahead.failure


def test_a_shape_that_fails_to_export_leaves_the_other_shapes_packaged(
    make_transformer: Callable[..., Transformer], src: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The several-sentence step failing (as sdpa's once did) keeps one sentence's package in use."""
    forward = ExportedStep.forward

    def one_sentence_only(self, tokens, rows, memory, memory_mask, *caches):
        if memory.size(0) > 1:
            raise RuntimeError("several sentences do not export")
        return forward(self, tokens, rows, memory, memory_mask, *caches)

    model = aot_model(make_transformer, {"kernel": "eager"})
    monkeypatch.setattr(ExportedStep, "forward", one_sentence_only)
    one = one_row_sources(src)[0]
    assert_same_hypotheses(*decode_both(model, one, beam=1))
    with pytest.warns(UserWarning, match="several sentences do not export"):
        assert_same_hypotheses(*decode_both(model, src, beam=1))
    ahead = model.compiled_steps.ahead
    assert ahead.failed == {(True, 1, 1)} and "several sentences" in ahead.failure
    runner, calls = ahead.runners[False, 1, 1], []
    monkeypatch.setattr(runner, "run", lambda tensors, run=runner.run: calls.append(1) or run(tensors))
    assert_same_hypotheses(*decode_both(model, one, beam=1))
    assert calls  # one sentence's steps still through the package


def test_aot_leaves_bf16_autocast_to_the_other_steps(
    make_transformer: Callable[..., Transformer], src: torch.Tensor
) -> None:
    """The package computes in float32 as exported: under autocast (the torch-bf16 engine) it stands aside."""
    model = aot_model(make_transformer, {"kernel": "eager"})
    with torch.autocast("cpu", dtype=torch.bfloat16):
        compiled, eager = decode_both(model, one_row_sources(src)[0], beam=1)
    assert [h.tokens for hyps in compiled for h in hyps] == [h.tokens for hyps in eager for h in hyps]
    assert not model.compiled_steps.ahead.runners


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
