"""Packed training batches (``data.layout=packed``, issue 48): the collator lays sentences end to end with
their segments and host token counts, Lightning moves them whole, and the Transformer's packed forward pass
gives the padded batch's loss and gradients, for every kernel."""

from __future__ import annotations

import pytest
import torch
from helpers.attention_menu import ATTENTION
from helpers.batches import BOS, EOS, PAD, VOCAB
from lightning_fabric.utilities.apply_func import move_data_to_device

from app.attention.config import site_specs
from app.data.batch import Batch, BatchLayoutError, Collator, PackedBatch
from app.models import Transformer
from app.models.embeddings import SinusoidalPositions
from app.training.build import check_batch_layout
from app.training.losses import label_smoothed_nll, linear_smoothed_nll

pytestmark = pytest.mark.usefixtures("single_torch_thread")

# (index, source ids, target ids): lengths 6/5, 3/2, 1/7, 9/4 (+ EOS / BOS), the longest last
EXAMPLES = [
    (10, [4, 5, 6, 7, 8, 9], [11, 12, 13, 14, 15]),
    (11, [16, 17, 18], [19, 20]),
    (12, [21], [22, 23, 24, 25, 26, 27, 28]),
    (13, [29, 30, 31, 32, 33, 34, 35, 36, 37], [38, 39, 4, 5]),
]


def collate(**options: object) -> Batch | PackedBatch:
    return Collator(pad_id=PAD, bos_id=BOS, eos_id=EOS, **options)(EXAMPLES)


def test_the_packed_batch_holds_each_sentence_once_with_its_bounds_and_positions() -> None:
    batch = collate(layout="packed")
    assert isinstance(batch, PackedBatch)
    assert batch.src[:7].tolist() == [4, 5, 6, 7, 8, 9, EOS] and batch.src[7:11].tolist() == [16, 17, 18, EOS]
    assert batch.tgt_in[:6].tolist() == [BOS, 11, 12, 13, 14, 15]
    assert batch.tgt_out[:6].tolist() == [11, 12, 13, 14, 15, EOS]
    assert PAD not in batch.src.tolist() + batch.tgt_in.tolist() + batch.tgt_out.tolist()
    src, tgt = batch.src_segments, batch.tgt_segments
    assert src.offsets.tolist() == [0, 7, 11, 13, 23] and tgt.offsets.tolist() == [0, 6, 9, 17, 22]
    assert src.positions[5:9].tolist() == [5, 6, 0, 1]  # positions restart at each sentence
    assert tgt.ids.tolist() == [0] * 6 + [1] * 3 + [2] * 8 + [3] * 5
    assert (src.longest, tgt.longest) == (10, 8)
    assert batch.index.tolist() == [10, 11, 12, 13] and batch.sentences == 4
    assert batch.source_ids()[1] == [16, 17, 18, EOS]


def test_both_layouts_count_their_tokens_on_the_host_at_collate_time() -> None:
    padded, packed = collate(), collate(layout="packed")
    assert isinstance(padded, Batch)
    for batch in (padded, packed):  # plain ints, set by the collator: reading them never syncs a device
        assert type(batch.num_src_tokens) is int and type(batch.num_target_tokens) is int
        assert (batch.num_src_tokens, batch.num_target_tokens, batch.num_tokens) == (23, 22, 45)
    assert padded.num_target_tokens == int(padded.tgt_out.ne(PAD).sum())
    assert padded.slots == 4 * 10 + 4 * 8 and packed.slots == 45
    assert padded.source_ids() == packed.source_ids()
    for mine, theirs in zip(padded.sequence_lengths(), packed.sequence_lengths(), strict=True):
        assert mine.tolist() == theirs.tolist()


def test_pad_to_multiple_rounds_the_padded_lengths_up() -> None:
    batch = collate(pad_to_multiple=8)
    assert batch.src.shape == (4, 16) and batch.tgt_in.shape == (4, 8)  # 10 -> 16, 8 stays 8
    assert batch.num_tokens == 45 and batch.source_ids() == collate().source_ids()
    assert collate(pad_to_multiple=1).src.shape == (4, 10)
    # never past the model's max_positions (what the datamodule passes): 10 -> 12, not 16
    assert collate(pad_to_multiple=8, max_width=12).src.shape == (4, 12)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"layout": "jagged"}, r"data\.layout='jagged'; valid choices: padded, packed"),
        ({"pad_to_multiple": 0}, r"data\.pad_to_multiple=0 must be an integer >= 1"),
        ({"pad_to_multiple": 2.5}, r"data\.pad_to_multiple=2\.5 must be an integer >= 1"),
    ],
)
def test_a_bad_layout_option_is_named(options: dict, message: str) -> None:
    with pytest.raises(BatchLayoutError, match=message):
        Collator(pad_id=PAD, bos_id=BOS, eos_id=EOS, **options)


def test_an_rnn_or_a_compiled_model_refuses_the_packed_layout_before_training() -> None:
    def config(family: str, compile_model: bool = False) -> dict:
        return {"data": {"layout": "packed"}, "model": {"family": family}, "compile_model": compile_model}

    check_batch_layout(config("transformer"))
    with pytest.raises(
        BatchLayoutError, match=r"data\.layout=packed: model\.family=rnn .* use data\.layout=padded"
    ):
        check_batch_layout(config("rnn"))
    with pytest.raises(BatchLayoutError, match=r"compile_model=true"):
        check_batch_layout(config("transformer", compile_model=True))
    check_batch_layout({"data": {"layout": "padded"}, "model": {"family": "rnn"}})


def test_lightning_moves_a_packed_batch_whole() -> None:
    moved = move_data_to_device(collate(layout="packed"), torch.device("meta"))
    assert isinstance(moved, PackedBatch)
    tensors = [moved.src, moved.tgt_in, moved.tgt_out, moved.index, moved.src_segments.ids]
    tensors += [moved.tgt_segments.offsets, moved.tgt_segments.positions]
    assert all(t.device.type == "meta" for t in tensors)
    assert (moved.num_tokens, moved.src_segments.longest) == (45, 10)


def test_packed_positions_are_the_padded_ones_of_each_token() -> None:
    positions = SinusoidalPositions(d_model=6, max_len=12)
    segments = collate(layout="packed").src_segments
    x = torch.randn(segments.tokens, 6)
    padded = positions(segments.padded().unpack(x))  # (B, S, D)
    torch.testing.assert_close(
        positions.at(x, segments.positions, segments.longest), segments.padded().pack(padded)
    )
    with pytest.raises(ValueError, match="exceeds max_positions=8"):
        SinusoidalPositions(d_model=6, max_len=8).at(x, segments.positions, segments.longest)


def tiny_model(attention: dict) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(
        src_vocab_size=VOCAB,
        tgt_vocab_size=VOCAB,
        pad_id=PAD,
        attention=site_specs(attention, max_positions=16),
        d_model=16,
        num_heads=4,
        encoder_layers=2,
        decoder_layers=2,
        d_ff=32,
        dropout=0.0,
        max_positions=16,
    )
    return model.double().train()


def loss_and_grads(model: Transformer, batch: Batch | PackedBatch, fused: bool) -> tuple[float, list]:
    """The training loss (label smoothing 0.1) of ``batch`` and its gradients, as the module computes it."""
    if isinstance(batch, PackedBatch):
        args = (batch.src, batch.src_segments, batch.tgt_in, batch.tgt_segments)
        split = model.packed_output_features(*args) if fused else None
        logits = None if fused else model.forward_packed(*args)  # (Nt, V): real tokens only
    else:
        split = model.output_features(batch.src, batch.tgt_in) if fused else None
        logits = None if fused else model(batch.src, batch.tgt_in)  # (B, T, V)
    if split is not None:
        loss, _ = linear_smoothed_nll(*split, batch.tgt_out, epsilon=0.1, pad_id=PAD)
    else:
        loss, _ = label_smoothed_nll(logits, batch.tgt_out, epsilon=0.1, pad_id=PAD)
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return loss.item(), [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)]


@pytest.mark.parametrize("name", list(ATTENTION))
def test_the_packed_batch_gives_the_padded_batchs_loss_and_gradients(name: str) -> None:
    """float64, no dropout: the same loss and the same gradient of every parameter, with the output layer
    fused into the loss (training's default) and without it; every kernel (the default ``forward_packed``
    or a kernel's own padding-free form)."""
    model = tiny_model(ATTENTION[name])
    for fused in (True, False):
        padded_loss, padded_grads = loss_and_grads(model, collate(), fused)
        packed_loss, packed_grads = loss_and_grads(model, collate(layout="packed"), fused)
        assert packed_loss == pytest.approx(padded_loss, rel=1e-12)
        for (param, _), mine, theirs in zip(
            model.named_parameters(), packed_grads, padded_grads, strict=True
        ):
            torch.testing.assert_close(mine, theirs, rtol=1e-9, atol=1e-12, msg=param)
        assert any(g.abs().sum() > 0 for g in packed_grads)


def test_a_packed_batch_twice_is_two_copies_of_it() -> None:
    """R-Drop's doubled batch: each copy's logits are the batch's own (eval mode, no dropout)."""
    model, batch = tiny_model({"kernel": "eager"}).eval(), collate(layout="packed")
    both = batch.twice()
    assert both.sentences == 8 and both.num_tokens == 90 and both.tgt_segments.offsets[-1].item() == 44
    once = model.forward_packed(batch.src, batch.src_segments, batch.tgt_in, batch.tgt_segments)
    twice = model.forward_packed(both.src, both.src_segments, both.tgt_in, both.tgt_segments)
    torch.testing.assert_close(twice, torch.cat([once, once]))
