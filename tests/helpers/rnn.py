"""Tiny random models of the rnn family, one per attention mechanism (and the batch they are fed)."""

from __future__ import annotations

from typing import Any

import torch
from helpers.batches import BOS, EOS, PAD, VOCAB, random_batch

from app.models import RNNSeq2Seq, build_model

__all__ = ["ATTENTIONS", "BOS", "EOS", "PAD", "TINY_RNN", "VOCAB", "random_batch", "tiny_rnn"]

# The attention configs of the rnn family, by name (what conf/attention/*.yaml give, made small).
ATTENTIONS: dict[str, dict[str, Any]] = {
    "additive": {"mechanism": "additive", "decoder": "bahdanau", "attention_size": 12},
    "luong_dot": {"mechanism": "dot", "decoder": "luong", "input_feeding": True},
    "luong_general": {"mechanism": "general", "decoder": "luong", "input_feeding": True},
    "luong_concat": {"mechanism": "concat", "decoder": "luong", "input_feeding": True},
    "luong_general_no_feeding": {"mechanism": "general", "decoder": "luong", "input_feeding": False},
}
TINY_RNN: dict[str, Any] = {
    "family": "rnn",
    "embedding_size": 16,
    "encoder_hidden_size": 8,
    "decoder_hidden_size": 16,
    "dropout": 0.1,
    "tie_embeddings": True,
    "share_src_tgt_embeddings": False,
    "max_positions": 64,
}


def tiny_rnn(attention: str = "additive", seed: int = 0, **model: Any) -> RNNSeq2Seq:
    """A tiny random RNN in eval mode (``model`` overrides :data:`TINY_RNN`)."""
    torch.manual_seed(seed)
    net = build_model(
        {**TINY_RNN, **model}, ATTENTIONS[attention], src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, pad_id=PAD
    )
    return net.eval()
