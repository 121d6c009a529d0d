"""The reference kernel: explicit scores, masked softmax, weights available (Vaswani et al. 2017, eq. 1)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from app.attention.base import AttentionKernel, AttentionOutput, KernelCapabilities, repeat_kv
from app.attention.masks import attention_mask
from app.attention.registry import register_kernel


@register_kernel("eager")
class EagerAttention(AttentionKernel):
    """Plain softmax(QK^T / sqrt(Dh)) V; every other kernel is tested against this one."""

    capabilities = KernelCapabilities(shares_keys=True)

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        key_mask: Tensor | None = None,
        causal: bool = False,
        dropout_p: float = 0.0,
        need_weights: bool = False,
    ) -> AttentionOutput:
        num_heads = q.size(1)
        causal = (
            causal and q.size(2) > 1
        )  # one query (cached decoding) sits at the last key: it sees them all
        k, v = repeat_kv(k, num_heads), repeat_kv(v, num_heads)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.size(-1))  # (B, H, Tq, Tk)
        mask = attention_mask(key_mask, causal=causal, tq=q.size(2), tk=k.size(2), device=q.device)
        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1)
        if mask is not None:
            weights = weights * mask  # rows with no visible key become exactly zero, never NaN
        attn = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
        return AttentionOutput(context=attn @ v, weights=weights if need_weights else None)
