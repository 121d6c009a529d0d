"""PyTorch's fused ``scaled_dot_product_attention`` (flash / memory-efficient / math backends)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from app.attention.base import AttentionKernel, AttentionOutput, KernelCapabilities, rows_with_keys
from app.attention.kernels.eager import EagerAttention
from app.attention.masks import attention_mask
from app.attention.registry import register_kernel

# One query row per sentence (a cached decoding step) of many sentences on a CPU: the fused call pays a fixed
# cost per (row, head) pair, so above ~256 pairs the reference kernel's two batched products win (2.9x at
# 320 rows x 4 heads x 30 keys), below they lose (3x slower at one row): scripts/bench_step_ops.py, one
# thread. Same function; stateless, so shared.
_EXPLICIT = EagerAttention()
EXPLICIT_FROM_PAIRS = 256


def explicit_wins(pairs: int | torch.SymInt) -> bool:
    """Whether one query row of ``pairs`` (row, head) pairs is computed by the reference kernel.

    A program exported for any batch (an ahead-of-time package of several sentences, its row count
    symbolic) cannot branch on the count without constraining it to one side; it takes the reference
    kernel's products, which the packages of the eager kernel run at every size.
    """
    if not isinstance(pairs, int) and torch.compiler.is_exporting():
        return True
    return pairs > EXPLICIT_FROM_PAIRS


@register_kernel("sdpa")
class SDPAttention(AttentionKernel):
    """Fused attention; never materialises weights, so ``need_weights`` is unsupported."""

    capabilities = KernelCapabilities(returns_weights=False, shares_keys=True)

    def scores_per_query(self, length: int, *, head_dim: int) -> int:
        return 0  # fused: the scores live in on-chip tiles, never as a (T, T) tensor

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
        if need_weights:
            raise ValueError("the sdpa kernel cannot return attention weights; use kernel=eager")
        tq, tk = q.size(2), k.size(2)
        if tq == 1 and dropout_p == 0.0 and explicit_wins(q.size(0) * q.size(1)) and q.device.type == "cpu":
            return _EXPLICIT(q, k, v, key_mask=key_mask, causal=causal)
        causal = causal and tq > 1  # one query (cached decoding) sits at the last key: it sees them all
        gqa = k.size(1) != q.size(1)
        if key_mask is None and (not causal or tq == tk):
            context = F.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout_p, is_causal=causal, enable_gqa=gqa
            )
            return AttentionOutput(context=context)
        mask = attention_mask(key_mask, causal=causal, tq=tq, tk=tk, device=q.device)
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, enable_gqa=gqa)
        return AttentionOutput(context=context.masked_fill(~rows_with_keys(mask), 0.0))
