"""Multi-head attention with a configurable number of key/value heads.

One module covers three head layouts (the "mechanism" stays scaled dot-product attention):
MHA (``num_kv_heads == num_heads``, Vaswani et al. 2017), GQA (1 < num_kv_heads < num_heads,
Ainslie et al. 2023) and MQA (``num_kv_heads == 1``, Shazeer 2019). How softmax(QK^T)V is computed
is delegated to an :class:`~app.attention.base.AttentionKernel`.
"""

from __future__ import annotations

from torch import Tensor, nn

from app.attention.base import AttentionKernel
from app.attention.cache import KVCache
from app.attention.registry import AttentionConfigError


class MultiHeadAttention(nn.Module):
    """Projections, head split/merge and KV caching around an attention kernel."""

    def __init__(
        self,
        *,
        d_model: int,
        num_heads: int,
        kernel: AttentionKernel,
        num_kv_heads: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        check_head_layout(d_model=d_model, num_heads=num_heads, num_kv_heads=num_kv_heads)
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = d_model // num_heads
        self.q_proj = nn.Linear(d_model, num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(num_heads * self.head_dim, d_model, bias=bias)
        self.kernel = kernel
        self.dropout = dropout

    def _split(self, x: Tensor, heads: int) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, heads, self.head_dim).transpose(1, 2)  # (B, heads, T, Dh)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values (B, Hkv, T, Dh) of ``memory`` (B, T, D)."""
        return self._split(self.k_proj(memory), self.num_kv_heads), self._split(
            self.v_proj(memory), self.num_kv_heads
        )

    def forward(
        self,
        x: Tensor,
        *,
        memory: Tensor | None = None,
        key_mask: Tensor | None = None,
        causal: bool = False,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``x`` (B, Tq, D) to itself, or to ``memory`` (B, Tk, D) for cross-attention.

        ``key_mask`` (B, Tk) marks real keys (for self-attention with a cache: all keys so far).
        With a ``cache``, self-attention appends this step's keys/values; cross-attention computes
        them from ``memory`` once and reuses them on later steps. Returns the output (B, Tq, D) and,
        when asked for, the weights (B, H, Tq, Tk).
        """
        q = self._split(self.q_proj(x), self.num_heads)  # (B, H, Tq, Dh)
        if cache is not None and cache.static and cache.filled:
            k, v = cache.k, cache.v
        else:
            k, v = self.project_kv(x if memory is None else memory)  # (B, Hkv, Tk, Dh)
            if cache is not None:
                k, v = cache.append(k, v)
        out = self.kernel(
            q,
            k,
            v,
            key_mask=key_mask,
            causal=causal,
            dropout_p=self.dropout if self.training else 0.0,
            need_weights=need_weights,
        )
        b, _, tq, _ = out.context.shape
        merged = out.context.transpose(1, 2).reshape(b, tq, self.num_heads * self.head_dim)
        return self.out_proj(merged), out.weights


def check_head_layout(*, d_model: int, num_heads: int, num_kv_heads: int) -> None:
    """Reject head counts that cannot split the model width, naming the values."""
    if num_heads < 1 or d_model % num_heads:
        raise AttentionConfigError(f"num_heads={num_heads} must divide the model width d_model={d_model}")
    if not 1 <= num_kv_heads <= num_heads or num_heads % num_kv_heads:
        raise AttentionConfigError(
            f"num_kv_heads={num_kv_heads} must divide num_heads={num_heads} "
            f"(1 = MQA, {num_heads} = MHA, a divisor in between = GQA)"
        )
