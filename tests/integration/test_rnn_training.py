"""Each RNN attention type learns: a tiny model's loss clearly falls on a Multi30k slice in a few steps."""

from __future__ import annotations

import pytest
import torch
from helpers.rnn import ATTENTIONS

from app.data.tokenizer import Tokenizer
from app.inference.torch_engine import pad_batch
from app.models import build_model
from app.training.losses import label_smoothed_nll

pytestmark = pytest.mark.usefixtures("single_torch_thread")

SMALL = {
    "family": "rnn",
    "embedding_size": 32,
    "encoder_hidden_size": 32,
    "decoder_hidden_size": 64,
    "dropout": 0.0,
    "max_positions": 128,
}
SENTENCES, BATCH, STEPS = 96, 32, 45


def batches(tokenizer: Tokenizer, src: list[str], tgt: list[str]) -> list[tuple[torch.Tensor, ...]]:
    """(src, tgt_in, tgt_out) padded batches of the first sentences of the slice."""
    bos, eos, pad = tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id
    src_ids, tgt_ids = tokenizer.encode(src[:SENTENCES]), tokenizer.encode(tgt[:SENTENCES])
    out = []
    for start in range(0, SENTENCES, BATCH):
        s = [[*ids, eos] for ids in src_ids[start : start + BATCH]]
        t = tgt_ids[start : start + BATCH]
        out.append(
            (
                pad_batch(s, pad),
                pad_batch([[bos, *ids] for ids in t], pad),
                pad_batch([[*ids, eos] for ids in t], pad),
            )
        )
    return out


@pytest.mark.parametrize("attention", ["additive", "luong_dot", "luong_general", "luong_concat"])
def test_short_training_run_learns(
    attention: str, spm_tokenizer: Tokenizer, multi30k_slice: tuple[list[str], list[str]]
) -> None:
    torch.manual_seed(0)
    vocab = spm_tokenizer.vocab_size
    model = build_model(
        SMALL, ATTENTIONS[attention], src_vocab_size=vocab, tgt_vocab_size=vocab, pad_id=spm_tokenizer.pad_id
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    data = batches(spm_tokenizer, *multi30k_slice)
    losses = []
    for step in range(STEPS):
        src, tgt_in, tgt_out = data[step % len(data)]
        loss, _ = label_smoothed_nll(model(src, tgt_in), tgt_out, epsilon=0.0, pad_id=spm_tokenizer.pad_id)
        loss = loss / tgt_out.ne(spm_tokenizer.pad_id).sum()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < 0.6 * first, (first, last)
