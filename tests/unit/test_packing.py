"""The encoder without its padded rows (:mod:`app.attention.packing`): the same memory at every real position
as the padded encoder, for every kernel, zeros at the padding; training keeps the padded layout."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from helpers.attention_menu import attention_menu
from helpers.batches import random_sources

from app.attention.packing import PackedRows
from app.decoding import output_limits
from app.decoding.beam import beam_hypotheses
from app.models import Transformer

pytestmark = pytest.mark.usefixtures("single_torch_thread")

PAD, BOS, EOS, VOCAB = 0, 2, 3, 20
ATTENTION = attention_menu(
    "eager", "eager_gqa", "sdpa_mqa", "flash", "sparse", "linformer", "linear", "lsh", "lsh_shared_qk"
)
ATTENTION["linformer_encoder"] = {
    "kernel": "eager",
    "sites": {"encoder_self": {"kernel": "linformer", "options": {"k": 4}}},
}


def test_pack_and_unpack_round_trip() -> None:
    mask = torch.tensor([[True, True, True], [True, False, False], [True, True, False]])
    packed = PackedRows.of(mask)
    x = torch.arange(3 * 3 * 2, dtype=torch.float32).view(3, 3, 2)
    rows = packed.pack(x)
    assert packed.rows == 6 and rows.shape == (6, 2)
    assert torch.equal(rows, x[mask])  # batch-major order
    back = packed.unpack(rows)
    assert torch.equal(back[mask], x[mask]) and not back[~mask].any()


def test_pack_reads_a_strided_view_as_its_copy() -> None:
    mask = torch.tensor([[True, True, False, False], [True, True, True, True]])
    packed = PackedRows.of(mask)
    heads = torch.randn(2, 3, 4, 5)  # (B, H, S, Dh)
    view = heads.transpose(1, 2)  # (B, S, H, Dh), not contiguous
    assert torch.equal(packed.pack(view), packed.pack(view.contiguous()))


def encode(model: Transformer, src: torch.Tensor, *, pack: bool) -> torch.Tensor:
    model.pack_padding = pack
    with torch.no_grad():
        return model.encode(src).memory


@pytest.mark.parametrize("name", list(ATTENTION))
def test_packed_encoder_equals_the_padded_one(
    make_transformer: Callable[..., Transformer], name: str
) -> None:
    model = make_transformer(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, seed=1, attention=ATTENTION[name])
    model.eval()
    src = random_sources(9, 2, 11, vocab=VOCAB)
    real = src != PAD
    assert not real.all()  # the batch has padding to remove
    packed, padded = encode(model, src, pack=True), encode(model, src, pack=False)
    torch.testing.assert_close(packed[real], padded[real], rtol=1e-5, atol=1e-5)
    assert not packed[~real].any()


@pytest.mark.parametrize("name", ["eager", "linear", "lsh_shared_qk"])
def test_packed_encoder_gives_the_same_beams(make_transformer: Callable[..., Transformer], name: str) -> None:
    model = make_transformer(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, seed=2, attention=ATTENTION[name])
    model.eval()
    src = random_sources(12, 3, 11, vocab=VOCAB)
    found = {}
    for pack in (True, False):
        model.pack_padding = pack
        with torch.no_grad():
            limits = output_limits(src, PAD, max_len=20)
            hyps = beam_hypotheses(model, src, beam_size=3, bos_id=BOS, eos_id=EOS, limits=limits, nbest=3)
        found[pack] = [[h.tokens for h in sentence] for sentence in hyps]
    assert found[True] == found[False]


def test_training_keeps_the_padded_layout(make_transformer: Callable[..., Transformer]) -> None:
    """With gradients the encoder never packs: training's arithmetic and dropout draws stay as they were."""
    model = make_transformer(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, seed=3)
    src = random_sources(5, 2, 9, vocab=VOCAB)
    seen: list[tuple[int, ...]] = []
    hook = model.encoder[0].ffn.register_forward_hook(lambda _m, args, _o: seen.append(tuple(args[0].shape)))
    model.encode(src).memory.sum().backward()
    with torch.no_grad():
        model.encode(src)
    hook.remove()
    assert seen[0] == (*src.shape, model.encoder_norm.normalized_shape[0])  # (B, S, D) with gradients
    assert seen[1] == (int((src != PAD).sum()), model.encoder_norm.normalized_shape[0])  # (N, D) without
