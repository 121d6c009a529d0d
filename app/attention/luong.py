"""Luong et al. 2015, section 3.1, eq. 8: three score functions of the current decoder state s_t.

    dot:     s_t^T h_i
    general: s_t^T W_a h_i
    concat:  v_a^T tanh(W_a [s_t; h_i])

The source-only parts (``W_a h_i`` for general, the memory half of ``W_a`` for concat) are
precomputed once per sentence.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from app.attention.mechanisms import AttentionMechanism, register_mechanism
from app.attention.registry import AttentionConfigError


def dot_scores(query: Tensor, keys: Tensor) -> Tensor:
    """(B, S) inner products of ``query`` (B, D) with each of ``keys`` (B, S, D)."""
    return torch.bmm(keys, query.unsqueeze(-1)).squeeze(-1)


@register_mechanism("dot")
class DotAttention(AttentionMechanism):
    """score(s_t, h_i) = s_t^T h_i; needs the decoder state and encoder outputs to be the same size."""

    def __init__(self, *, query_size: int, memory_size: int) -> None:
        if query_size != memory_size:
            raise AttentionConfigError(
                f"dot attention needs equal sizes, got decoder state {query_size} and encoder output "
                f"{memory_size} (2 x encoder_hidden_size): set model.decoder_hidden_size={memory_size} "
                f"or model.encoder_hidden_size={query_size // 2}, or use attention=luong_general"
            )
        super().__init__(query_size=query_size, memory_size=memory_size)

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        return dot_scores(query, keys)


@register_mechanism("general")
class GeneralAttention(AttentionMechanism):
    """score(s_t, h_i) = s_t^T W_a h_i, with W_a h_i precomputed per sentence."""

    def __init__(self, *, query_size: int, memory_size: int) -> None:
        super().__init__(query_size=query_size, memory_size=memory_size)
        self.key_proj = nn.Linear(memory_size, query_size, bias=False)  # W_a

    def project_keys(self, memory: Tensor) -> Tensor:
        return self.key_proj(memory)  # (B, S, Dq)

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        return dot_scores(query, keys)


@register_mechanism("concat")
class ConcatAttention(AttentionMechanism):
    """score(s_t, h_i) = v_a^T tanh(W_a [s_t; h_i]) = v_a^T tanh(W_q s_t + W_k h_i), W_a = [W_q W_k].

    Luong's concat score is the additive form applied to the current state; splitting W_a lets the
    memory half be computed once per sentence.
    """

    def __init__(self, *, query_size: int, memory_size: int, attention_size: int | None = None) -> None:
        super().__init__(query_size=query_size, memory_size=memory_size)
        size = attention_size or query_size
        if size < 1:
            raise ValueError(f"attention_size must be >= 1, got {attention_size}")
        self.query_proj = nn.Linear(query_size, size, bias=False)  # W_a, columns of s_t
        self.key_proj = nn.Linear(memory_size, size, bias=False)  # W_a, columns of h_i
        self.energy = nn.Linear(size, 1, bias=False)  # v_a

    def project_keys(self, memory: Tensor) -> Tensor:
        return self.key_proj(memory)  # (B, S, A)

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        hidden = (keys + self.query_proj(query).unsqueeze(1)).tanh()  # (B, S, A)
        return self.energy(hidden).squeeze(-1)  # (B, S)
