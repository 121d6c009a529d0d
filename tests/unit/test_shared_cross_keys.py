"""Beam search shares each sentence's cross-attention keys/values across its K beams (kernels that
``shares_keys``) instead of copying them K times: the same hypotheses and scores as the copied form
(:meth:`Seq2Seq.start_beams`'s default), for every kernel, and with sentences leaving the batch early."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
from helpers.attention_menu import attention_menu
from helpers.batches import random_sources

from app.decoding import output_limits
from app.decoding.beam import beam_hypotheses
from app.models import Transformer
from app.models.seq2seq import Seq2Seq

pytestmark = pytest.mark.usefixtures("single_torch_thread")

PAD, BOS, EOS, VOCAB = 0, 2, 3, 20

ATTENTION = attention_menu(
    "eager", "eager_gqa", "sdpa_mqa", "flash", "sparse", "linformer", "linear", "lsh", "lsh_shared_qk"
)


def copied_beams(model: Seq2Seq) -> Callable:
    """``start_beams`` as every model family has it: the encoder output copied K times."""
    return lambda encoded, beams: Seq2Seq.start_beams(model, encoded, beams)


def search(model: Transformer, src: torch.Tensor, k: int) -> list[list[tuple[list[int], float]]]:
    limits = output_limits(src, PAD, max_len=20)
    found = beam_hypotheses(model, src, beam_size=k, bos_id=BOS, eos_id=EOS, limits=limits, nbest=k)
    return [[(h.tokens, h.score) for h in hyps] for hyps in found]


@pytest.mark.parametrize("name", list(ATTENTION))
def test_shared_cross_keys_give_the_copied_form_s_hypotheses(
    make_transformer: Callable[..., Transformer], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = make_transformer(
        src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, tie_embeddings=False, seed=1, attention=ATTENTION[name]
    )
    with torch.no_grad():
        model.output.weight.mul_(3.0)  # sentences end at varied steps, so select_rows drops some early
    src = random_sources(12, 3, 11, vocab=VOCAB)
    shared = search(model, src, k=4)
    monkeypatch.setattr(model, "start_beams", copied_beams(model))
    copied = search(model, src, k=4)
    assert [[tokens for tokens, _ in hyps] for hyps in shared] == [[t for t, _ in hyps] for hyps in copied]
    for mine, theirs in zip(shared, copied, strict=True):
        torch.testing.assert_close([s for _, s in mine], [s for _, s in theirs], rtol=1e-5, atol=1e-5)


def test_a_sharing_kernel_caches_one_row_per_sentence(make_transformer: Callable[..., Transformer]) -> None:
    model = make_transformer(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB)  # eager: shares keys
    src = random_sources(3, 3, 7, vocab=VOCAB)
    with torch.no_grad():
        state = model.start_beams(model.encode(src), 4)
        model.decode_step(torch.full((12,), BOS), state)
        assert {cache.cross_attn.k.size(0) for cache in state.caches} == {3}
        assert {cache.self_attn.k.size(0) for cache in state.caches} == {12}
        state.select_rows(torch.arange(4, 12))  # the first sentence leaves
        assert state.memory.size(0) == 2 and {c.cross_attn.k.size(0) for c in state.caches} == {2}
        model.decode_step(torch.full((8,), 5), state)


@pytest.mark.parametrize("shares", [True, False], ids=["shared", "kernel_without_sharing_gets_copies"])
def test_grouped_cross_attention_equals_copied_rows_with_weights(
    make_transformer: Callable[..., Transformer], monkeypatch: pytest.MonkeyPatch, shares: bool
) -> None:
    layer = make_transformer(attention={"kernel": "eager", "num_kv_heads": 2}).decoder[0].cross_attn
    caps = dataclasses.replace(layer.kernel.capabilities, shares_keys=shares)
    monkeypatch.setattr(type(layer.kernel), "capabilities", caps)
    x, memory = torch.randn(6, 1, 32), torch.randn(2, 5, 32)  # 3 query rows per sentence
    mask = torch.tensor([[True] * 5, [True] * 2 + [False] * 3])
    with torch.no_grad():
        cache = layer.kernel.new_cache(cross=True)
        out, weights = layer(x, memory=memory, key_mask=mask, cache=cache, need_weights=True, group=3)
        rows = torch.arange(2).repeat_interleave(3)
        ref, ref_weights = layer(x, memory=memory[rows], key_mask=mask[rows], need_weights=True)
    assert (cache.k.size(0), cache.shared) == ((2, True) if shares else (6, False))
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(weights, ref_weights)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["eager", "sdpa_mqa", "flash", "linformer"])
def test_shared_cross_keys_on_a_gpu(
    make_transformer: Callable[..., Transformer], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    attention = ATTENTION[name] if name != "flash" else {"kernel": "flash"}  # flash-attn where installed
    model = make_transformer(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, seed=1, attention=attention).cuda()
    src = random_sources(12, 3, 11, vocab=VOCAB).cuda()
    shared = search(model, src, k=4)
    monkeypatch.setattr(model, "start_beams", copied_beams(model))
    copied = search(model, src, k=4)
    assert [[t for t, _ in hyps] for hyps in shared] == [[t for t, _ in hyps] for hyps in copied]
