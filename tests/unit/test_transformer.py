"""Tests for app.models.transformer: incremental decoding, padding invariance, embeddings, positions."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from helpers.batches import BOS, EOS, PAD, random_batch

from app.models import Transformer
from app.models.embeddings import sinusoid_table

pytestmark = pytest.mark.usefixtures("single_torch_thread")

MakeTransformer = Callable[..., Transformer]  # the conftest fixture's type


LAYOUTS = {
    "pre_ln": ({"pre_norm": True}, {"kernel": "eager"}),
    "post_ln": ({"pre_norm": False}, {"kernel": "eager"}),
    "gqa": ({}, {"kernel": "eager", "num_kv_heads": 2}),
    "mqa_post_ln": ({"pre_norm": False}, {"kernel": "eager", "num_kv_heads": 1}),
    "sdpa_gqa": ({}, {"kernel": "sdpa", "num_kv_heads": 2}),
    "mixed_sites": ({}, {"kernel": "sdpa", "sites": {"cross": {"kernel": "eager", "num_kv_heads": 1}}}),
}


@pytest.mark.parametrize(("model_cfg", "attention"), LAYOUTS.values(), ids=LAYOUTS.keys())
def test_incremental_decoding_equals_teacher_forcing(
    make_transformer: MakeTransformer, model_cfg: dict, attention: dict
) -> None:
    model = make_transformer(attention=attention, **model_cfg)
    src, tgt_in = random_batch()
    with torch.no_grad():
        full = F.log_softmax(model(src, tgt_in), dim=-1)
        state = model.start_decoding(model.encode(src))
        steps = [model.decode_step(tgt_in[:, t], state) for t in range(tgt_in.size(1))]
    assert state.step == tgt_in.size(1)
    torch.testing.assert_close(torch.stack(steps, dim=1), full, rtol=1e-5, atol=1e-5)


def test_incremental_decoding_survives_beam_reordering(make_transformer: MakeTransformer) -> None:
    # Beam search keeps the hypotheses of one sentence in adjacent rows and reorders them among themselves.
    model = make_transformer(attention={"kernel": "eager", "num_kv_heads": 2})
    src, tgt_in = random_batch()
    src = src[:1].expand(3, -1)  # three hypotheses of one sentence
    order = torch.tensor([2, 0, 0])
    with torch.no_grad():
        state = model.start_decoding(model.encode(src))
        for t in range(3):
            model.decode_step(tgt_in[:, t], state)
        state.reorder(order)  # row r now continues the prefix of row order[r]
        got = model.decode_step(tgt_in[order, 3], state)
        expected = F.log_softmax(model(src, tgt_in[order, :4]), dim=-1)[:, 3]
        unordered = F.log_softmax(model(src, tgt_in[:, :4]), dim=-1)[:, 3]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, unordered, atol=1e-3)


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_padded_sentence_is_the_same_alone_and_in_a_batch(
    make_transformer: MakeTransformer, kernel: str
) -> None:
    model = make_transformer(attention={"kernel": kernel})
    src, tgt_in = random_batch()
    with torch.no_grad():
        batch_memory = model.encode(src).memory
        batch_logits = model(src, tgt_in)
        for row, (src_len, tgt_len) in enumerate([(7, 6), (4, 3), (2, 5)]):
            alone_src, alone_tgt = src[row : row + 1, :src_len], tgt_in[row : row + 1, :tgt_len]
            memory = model.encode(alone_src).memory
            torch.testing.assert_close(batch_memory[row : row + 1, :src_len], memory, rtol=1e-5, atol=1e-5)
            logits = model(alone_src, alone_tgt)
            torch.testing.assert_close(batch_logits[row : row + 1, :tgt_len], logits, rtol=1e-5, atol=1e-5)


def test_padding_changes_nothing_but_a_real_token_does(make_transformer: MakeTransformer) -> None:
    # The padding invariance above must come from masking: an extra real token changes the result.
    model = make_transformer()
    src = torch.tensor([[5, 6, 7, EOS]])
    tgt = torch.tensor([[BOS, 9]])
    with torch.no_grad():
        base = model(src, tgt)
        padded = model(torch.tensor([[5, 6, 7, EOS, PAD, PAD]]), tgt)
        longer = model(torch.tensor([[5, 6, 7, 8, EOS]]), tgt)
    torch.testing.assert_close(padded, base, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(longer, base, atol=1e-3)


def test_eval_mode_is_deterministic_and_train_mode_uses_dropout(make_transformer: MakeTransformer) -> None:
    model = make_transformer(dropout=0.3)
    src, tgt_in = random_batch()
    with torch.no_grad():
        assert torch.equal(model(src, tgt_in), model(src, tgt_in))
        model.train()
        assert not torch.equal(model(src, tgt_in), model(src, tgt_in))


def test_tied_embeddings_share_storage(make_transformer: MakeTransformer) -> None:
    model = make_transformer(tie_embeddings=True, share_src_tgt_embeddings=True)
    assert model.output.weight is model.tgt_embed.weight is model.src_embed.weight
    with torch.no_grad():
        model.tgt_embed.weight[7, 0] = 123.0
    assert model.output.weight[7, 0] == 123.0 and model.src_embed.weight[7, 0] == 123.0

    two_way = make_transformer(tie_embeddings=True, share_src_tgt_embeddings=False)
    assert two_way.output.weight.data_ptr() == two_way.tgt_embed.weight.data_ptr()
    assert two_way.src_embed.weight.data_ptr() != two_way.tgt_embed.weight.data_ptr()

    untied = make_transformer(tie_embeddings=False)
    assert untied.output.weight.data_ptr() != untied.tgt_embed.weight.data_ptr()
    # Shared matrices count once: 40 x 32 each.
    assert untied.num_parameters() - two_way.num_parameters() == 40 * 32
    assert two_way.num_parameters() - model.num_parameters() == 40 * 32


def test_tied_embeddings_stay_tied_after_loading_a_state_dict(make_transformer: MakeTransformer) -> None:
    model = make_transformer(tie_embeddings=True, share_src_tgt_embeddings=True)
    other = make_transformer(tie_embeddings=True, share_src_tgt_embeddings=True, seed=1)
    model.load_state_dict(other.state_dict())
    assert model.output.weight is model.src_embed.weight
    assert torch.equal(model.output.weight, other.output.weight)


def test_shared_embeddings_need_one_vocabulary(make_transformer: MakeTransformer) -> None:
    with pytest.raises(ValueError, match="one joint vocabulary, got 40 source and 50 target"):
        make_transformer(src_vocab_size=40, tgt_vocab_size=50, share_src_tgt_embeddings=True)
    model = make_transformer(src_vocab_size=40, tgt_vocab_size=50)
    assert model.output.out_features == 50


def test_padding_embedding_is_zero(tiny_transformer: Transformer) -> None:
    model = tiny_transformer
    assert torch.all(model.src_embed.weight[PAD] == 0)
    assert torch.all(model.tgt_embed.weight[PAD] == 0)


@pytest.mark.parametrize("d_model", [32, 7])
def test_sinusoid_table_matches_the_formula(d_model: int) -> None:
    table = sinusoid_table(100, d_model)
    assert table.shape == (100, d_model)
    for pos in (0, 1, 17, 99):
        for i in range(0, d_model, 3):
            angle = pos / 10000 ** ((i - i % 2) / d_model)
            expected = math.sin(angle) if i % 2 == 0 else math.cos(angle)
            assert table[pos, i].item() == pytest.approx(expected, abs=1e-6), (pos, i)


@pytest.mark.parametrize("d_model", [32, 7])
def test_sinusoid_halves_hold_the_same_features_sines_first(d_model: int) -> None:
    """Marian's layout: the interleaved table's sines, then its cosines (an odd width: one more sine)."""
    interleaved, halves = sinusoid_table(50, d_model), sinusoid_table(50, d_model, "halves")
    torch.testing.assert_close(halves, torch.cat([interleaved[:, 0::2], interleaved[:, 1::2]], dim=1))
    with pytest.raises(ValueError, match="interleaved, halves"):
        sinusoid_table(4, 8, "rotary")


def test_model_adds_the_sinusoid_table(make_transformer: MakeTransformer) -> None:
    model = make_transformer(max_positions=16)
    torch.testing.assert_close(model.positions.table, sinusoid_table(16, 32))
    x = torch.zeros(1, 4, 32)
    torch.testing.assert_close(model.positions(x, offset=3), sinusoid_table(16, 32)[None, 3:7])


def test_positions_beyond_max_positions_raise(make_transformer: MakeTransformer) -> None:
    model = make_transformer(max_positions=8)
    with torch.no_grad():
        model.encode(torch.full((1, 8), 5))  # exactly at the limit is fine
        with pytest.raises(ValueError, match="9 positions exceeds max_positions=8"):
            model.encode(torch.full((1, 9), 5))
        with pytest.raises(ValueError, match="max_positions=8"):
            model(torch.full((1, 3), 5), torch.full((1, 9), 5))
        state = model.start_decoding(model.encode(torch.full((1, 3), 5)))
        for _ in range(8):
            model.decode_step(torch.tensor([5]), state)
        with pytest.raises(ValueError, match="9 positions exceeds max_positions=8"):
            model.decode_step(torch.tensor([5]), state)
