"""Tests for app.acceleration.packed_linear: oneDNN-packed wide linears compute what nn.Linear computes, and
step aside (plain ``F.linear``, bit for bit) wherever they do not apply."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from helpers.batches import random_sources

from app.acceleration.decoding import CompileReport, accelerate
from app.acceleration.packed_linear import (
    MIN_WEIGHTS,
    NARROW_MIN_ROWS,
    onednn_linear_available,
    pack_wide_linears,
)
from app.acceleration.step import compile_available
from app.decoding import beam_search, greedy_search, output_limits
from app.inference.engine import SearchSettings
from app.inference.torch_engine import TorchEngine, load_torch_engine
from app.models import Transformer

pytestmark = [
    pytest.mark.usefixtures("single_torch_thread"),
    pytest.mark.skipif(not onednn_linear_available(), reason="this torch build has no oneDNN linear"),
]

PAD, BOS, EOS = 0, 2, 3


def packed_layer(bias: bool = True) -> torch.nn.Linear:
    torch.manual_seed(0)
    layer = torch.nn.Linear(48, 80, bias=bias).eval()
    assert pack_wide_linears(layer, min_weights=0) == 1
    return layer


@pytest.mark.parametrize("bias", [True, False])
def test_packed_layer_computes_the_linear_for_any_leading_shape(bias: bool) -> None:
    layer = packed_layer(bias)
    x = torch.randn(3, 5, 48)
    with torch.inference_mode():
        out = layer(x)
    assert out.shape == (3, 5, 80)
    torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


def test_one_row_training_gradients_autocast_and_changed_weights_use_the_plain_linear() -> None:
    layer = packed_layer()
    one, rows = torch.randn(1, 48), torch.randn(6, 48)
    with torch.inference_mode():
        assert torch.equal(layer(one), F.linear(one, layer.weight, layer.bias))  # one row: MKL was faster
    assert torch.equal(layer(rows), F.linear(rows, layer.weight, layer.bias))  # gradients enabled
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(rows).dtype == torch.bfloat16  # autocast's product, not the float32 packed one
    layer.train()
    with torch.inference_mode():
        assert torch.equal(layer(rows), F.linear(rows, layer.weight, layer.bias))
    layer.eval()
    with torch.no_grad():
        layer.weight.mul_(2.0)  # the packed copy is stale now
    with torch.inference_mode():
        assert torch.equal(layer(rows), F.linear(rows, layer.weight, layer.bias))


def test_weights_made_in_inference_mode_are_left_unpacked() -> None:
    with torch.inference_mode():
        layer = torch.nn.Linear(48, 80).eval()
    assert pack_wide_linears(layer, min_weights=0) == 0 and not hasattr(layer, "packed_weight")


def test_wide_linears_pack_from_two_rows_narrow_ones_from_more_and_the_state_dict_is_unchanged(
    make_transformer: Callable[..., Transformer],
) -> None:
    model = make_transformer(src_vocab_size=30, tgt_vocab_size=30)
    before = {name: value.clone() for name, value in model.state_dict().items()}
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    threshold = max(m.weight.numel() for m in linears)  # the feed-forward pair's size: only they are wide
    assert pack_wide_linears(model, min_weights=threshold) == len(linears)
    wide = [m for m in linears if m.weight.numel() >= threshold]
    assert 0 < len(wide) < len(linears)
    assert all(m.packed_min_rows == (2 if m in wide else NARROW_MIN_ROWS) for m in linears)
    assert model.state_dict().keys() == before.keys()
    assert all(torch.equal(model.state_dict()[name], value) for name, value in before.items())


def test_a_narrow_layer_stays_plain_below_its_row_threshold() -> None:
    torch.manual_seed(0)
    layer = torch.nn.Linear(48, 80).eval()
    pack_wide_linears(layer)  # 48 x 80 weights: narrow
    below, enough = torch.randn(NARROW_MIN_ROWS - 1, 48), torch.randn(NARROW_MIN_ROWS, 48)
    with torch.inference_mode():
        assert torch.equal(layer(below), F.linear(below, layer.weight, layer.bias))
        torch.testing.assert_close(
            layer(enough), F.linear(enough, layer.weight, layer.bias), rtol=1e-5, atol=1e-5
        )


def decode_all(model: torch.nn.Module, src: torch.Tensor) -> tuple[list, list]:
    limits = output_limits(src, PAD, max_len=12)
    common = {"bos_id": BOS, "eos_id": EOS, "limits": limits, "banned": (PAD, BOS)}
    return greedy_search(model, src, **common), beam_search(model, src, beam_size=4, **common)


def test_decoding_is_unchanged(make_transformer: Callable[..., Transformer]) -> None:
    plain = make_transformer(src_vocab_size=30, tgt_vocab_size=30, seed=2)
    packed = make_transformer(src_vocab_size=30, tgt_vocab_size=30, seed=2)
    assert pack_wide_linears(packed, min_weights=0) > 0
    src = random_sources(12, 3, 9, vocab=30)
    assert decode_all(packed, src) == decode_all(plain, src)


@pytest.mark.skipif(compile_available() is not None, reason="inductor finds no C++ compiler here")
def test_packages_trace_the_plain_linear_and_compute_the_same(
    make_transformer: Callable[..., Transformer],
) -> None:
    """Exporting sees the plain product (an opaque oneDNN weight cannot be exported): the encoder of
    several sentences, whose feed-forward rows go through the packed weights in eager decoding, is packaged
    without a fallback and computes what the plain model computes."""
    plain = make_transformer(src_vocab_size=30, tgt_vocab_size=30, seed=2)
    packed = make_transformer(src_vocab_size=30, tgt_vocab_size=30, seed=2)
    pack_wide_linears(packed, min_weights=0)
    fast, _ = accelerate(packed)
    src = random_sources(6, 3, 9, vocab=30)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error")  # a package that failed would fall back with a warning
        memory = fast.encode(src).memory
        torch.testing.assert_close(memory, plain.encode(src).memory, rtol=1e-5, atol=1e-5)
    assert CompileReport.of(fast).packages == 1 and CompileReport.of(fast).failure is None


def test_translators_loaded_on_the_cpu_pack_their_linears(
    tmp_path: Path, checkpoint_factory: Callable[..., torch.nn.Module]
) -> None:
    path = tmp_path / "model.ckpt"
    d_ff = MIN_WEIGHTS // 32  # the feed-forward pair is just wide enough; the 32 x 32 projections are not
    model_cfg = {"family": "transformer", "d_model": 32, "num_heads": 4, "encoder_layers": 1}
    model_cfg |= {"decoder_layers": 1, "d_ff": d_ff, "max_positions": 64}
    model = checkpoint_factory(path, model_cfg=model_cfg, attention_cfg={"kernel": "eager"}).eval()
    translator, _ = load_torch_engine(path)
    packed = {
        name: m.packed_min_rows for name, m in translator.model.named_modules() if hasattr(m, "packed_weight")
    }
    wide = {name for name, rows in packed.items() if rows == 2}
    assert len(wide) == 4 and all("ffn" in name for name in wide)  # 2 per layer, encoder and decoder
    linears = {name for name, m in translator.model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert packed.keys() == linears  # the narrow ones too, from NARROW_MIN_ROWS rows
    plain = TorchEngine(model, translator.src_tokenizer, translator.tgt_tokenizer)
    lines = ["ein Hund läuft .", "zwei Männer spielen Fußball auf einer Wiese .", ""]
    for settings in (SearchSettings(beam=1, batch_size=2), SearchSettings(beam=3, batch_size=2)):
        assert translator.translate(lines, settings) == plain.translate(lines, settings)
