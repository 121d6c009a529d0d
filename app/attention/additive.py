"""Additive attention (Bahdanau et al. 2015, section 3.1 and appendix A.1.2).

    e_i = v^T tanh(W_s s + W_h h_i)        a = softmax(e)        c = sum_i a_i h_i

``W_h h_i`` depends on the source only and is computed once per sentence (the paper's own remark in
A.1.2), so a decoder step adds one (B, Dq) x (Dq, A) product to the precomputed keys.
"""

from __future__ import annotations

from torch import Tensor, nn

from app.attention.mechanisms import AttentionMechanism, register_mechanism


@register_mechanism("additive")
class AdditiveAttention(AttentionMechanism):
    """score(s, h_i) = v^T tanh(W_s s + W_h h_i); ``attention_size`` is the width A of the tanh layer."""

    def __init__(self, *, query_size: int, memory_size: int, attention_size: int | None = None) -> None:
        super().__init__(query_size=query_size, memory_size=memory_size)
        size = attention_size or query_size
        if size < 1:
            raise ValueError(f"attention_size must be >= 1, got {attention_size}")
        self.key_proj = nn.Linear(memory_size, size, bias=False)  # W_h
        self.query_proj = nn.Linear(query_size, size, bias=False)  # W_s
        self.energy = nn.Linear(size, 1, bias=False)  # v

    def project_keys(self, memory: Tensor) -> Tensor:
        return self.key_proj(memory)  # (B, S, A)

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        hidden = (keys + self.query_proj(query).unsqueeze(1)).tanh()  # (B, S, A)
        return self.energy(hidden).squeeze(-1)  # (B, S)
