"""Tests for app.acceleration.weight_layout: column-major Linear weights change the layout, not the model."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers.batches import random_sources
from helpers.rnn import tiny_rnn

from app.acceleration.weight_layout import is_column_major, store_column_major
from app.checkpoint import load_model
from app.decoding import beam_search, greedy_search, output_limits
from app.inference.engine import SearchSettings
from app.inference.torch_engine import TorchEngine, load_torch_engine
from app.models import Transformer
from app.models.seq2seq import Seq2Seq

pytestmark = pytest.mark.usefixtures("single_torch_thread")

PAD, BOS, EOS = 0, 2, 3


def linear_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: m.weight for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def test_weights_move_to_column_major_with_their_values_and_ties(
    make_transformer: Callable[..., Transformer],
) -> None:
    model = make_transformer(src_vocab_size=30, tgt_vocab_size=30, tie_embeddings=True)
    before = {name: w.detach().clone() for name, w in model.state_dict().items()}
    assert not any(is_column_major(w) for w in linear_weights(model).values())

    moved = store_column_major(model)

    assert moved == len({id(w) for w in linear_weights(model).values()})  # the tied output moved once
    assert all(is_column_major(w) for w in linear_weights(model).values())
    assert model.output.weight is model.tgt_embed.weight  # still one parameter
    after = model.state_dict()
    assert before.keys() == after.keys()
    for name, value in before.items():
        assert torch.equal(after[name], value), name
    assert store_column_major(model) == 0  # already there


def test_column_major_is_recognised() -> None:
    weight = torch.randn(6, 4)
    assert not is_column_major(weight)
    assert is_column_major(weight.t().contiguous().t())
    assert is_column_major(torch.randn(1, 4))  # a single row is both layouts


def decode_all(model: Seq2Seq, src: torch.Tensor) -> tuple[list, list]:
    limits = output_limits(src, PAD, max_len=12)
    common = {"bos_id": BOS, "eos_id": EOS, "limits": limits, "banned": (PAD, BOS)}
    return greedy_search(model, src, **common), beam_search(model, src, beam_size=4, **common)


@pytest.mark.parametrize("family", ["transformer", "rnn"])
def test_decoding_is_unchanged(family: str, make_transformer: Callable[..., Transformer]) -> None:
    vocab = 30 if family == "transformer" else 40
    model = (
        make_transformer(src_vocab_size=vocab, tgt_vocab_size=vocab)
        if family == "transformer"
        else tiny_rnn()
    )
    src = random_sources(12, 3, 9, vocab=vocab)
    moved = copy.deepcopy(model)
    assert store_column_major(moved) > 0
    with torch.inference_mode():
        x = torch.randint(4, vocab, (12, 5))
        torch.testing.assert_close(moved(src, x), model(src, x), rtol=1e-5, atol=1e-5)
    assert decode_all(moved, src) == decode_all(model, src)


def test_translators_loaded_on_the_cpu_decode_with_column_major_weights(
    tmp_path: Path, checkpoint_factory: Callable[..., torch.nn.Module]
) -> None:
    path = tmp_path / "model.ckpt"
    model_cfg = {"family": "transformer", "d_model": 32, "num_heads": 4, "encoder_layers": 1}
    model_cfg |= {"decoder_layers": 1, "d_ff": 64, "max_positions": 64}
    checkpoint_factory(path, model_cfg=model_cfg, attention_cfg={"kernel": "eager"})
    translator, _ = load_torch_engine(path)
    assert all(is_column_major(w) for w in linear_weights(translator.model).values())
    loaded = load_model(path)  # as stored: row-major
    assert not any(is_column_major(w) for w in linear_weights(loaded.model).values())
    plain = TorchEngine(loaded.model, loaded.src_tokenizer, loaded.tgt_tokenizer)
    lines = ["ein Hund läuft .", "zwei Männer spielen Fußball auf einer Wiese .", ""]
    for settings in (SearchSettings(beam=1, batch_size=2), SearchSettings(beam=3, batch_size=2)):
        assert translator.translate(lines, settings) == plain.translate(lines, settings)
