"""PyTorch's fused ``scaled_dot_product_attention`` (flash / memory-efficient / math backends)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from app.attention.base import AttentionKernel, AttentionOutput, KernelCapabilities, rows_with_keys
from app.attention.kernels.eager import EagerAttention
from app.attention.masks import attention_mask
from app.attention.registry import register_kernel

# One query row per sentence (a cached decoding step) on a CPU: the reference kernel's two plain products
# beat the fused call, ~4x at 320 rows x 4 heads x 30 cached keys (3.4 against 0.86 ms, one thread), where
# the fused kernel's blocking has nothing to tile. Same function; stateless, so shared.
_EXPLICIT = EagerAttention()


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
        if tq == 1 and dropout_p == 0.0 and q.device.type == "cpu":
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
