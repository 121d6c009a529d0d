"""Multi-head attention with a configurable number of key/value heads.

One module covers three head layouts (the "mechanism" stays scaled dot-product attention):
MHA (``num_kv_heads == num_heads``, Vaswani et al. 2017), GQA (1 < num_kv_heads < num_heads,
Ainslie et al. 2023) and MQA (``num_kv_heads == 1``, Shazeer 2019). How softmax(QK^T)V is computed
is delegated to an :class:`~app.attention.base.AttentionKernel`.
"""

from __future__ import annotations

from torch import Tensor, nn

from app.attention.base import AttentionKernel, AttentionOutput
from app.attention.cache import AttentionCache
from app.attention.packing import PackedRows
from app.attention.registry import AttentionConfigError
from app.attention.segments import Segments


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
        # A shared-QK kernel (Reformer) takes its keys from the queries: no key projection at all.
        self.k_proj = (
            None if kernel.shared_qk else nn.Linear(d_model, num_kv_heads * self.head_dim, bias=bias)
        )
        self.v_proj = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(num_heads * self.head_dim, d_model, bias=bias)
        self.kernel = kernel
        kernel.bind(num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=self.head_dim)
        self.dropout = dropout

    def _split(self, x: Tensor, heads: int) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, heads, self.head_dim).transpose(1, 2)  # (B, heads, T, Dh)

    def project_kv(self, memory: Tensor, queries: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Keys and values (B, Hkv, T, Dh) of ``memory`` (B, T, D).

        Without a key projection (a ``shared_qk`` kernel), the keys are the kernel's function of
        ``queries`` (B, H, T, Dh), the projected ``memory`` itself: (B, H, T, Dh), one key per query head.
        """
        v = self._split(self.v_proj(memory), self.num_kv_heads)
        if self.k_proj is not None:
            return self._split(self.k_proj(memory), self.num_kv_heads), v
        if queries is None:
            raise ValueError(
                f"{type(self.kernel).__name__} shares queries and keys: project_kv needs the queries"
            )
        return self.kernel.shared_keys(queries), v

    def forward(
        self,
        x: Tensor,
        *,
        memory: Tensor | None = None,
        key_mask: Tensor | None = None,
        causal: bool = False,
        cache: AttentionCache | None = None,
        need_weights: bool = False,
        group: int = 1,
        packed: PackedRows | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``x`` (B, Tq, D) to itself, or to ``memory`` (B, Tk, D) for cross-attention.

        ``key_mask`` (B, Tk) marks real keys (for self-attention with a cache: all keys so far).
        With a ``cache`` (the kind the kernel keeps, ``kernel.new_cache``), the cache takes the call: a
        self-attention cache adds this step's keys/values (or a recurrent kernel's state), a cross-attention
        cache computes them from ``memory`` once and reuses them on later steps. Returns the output
        (B, Tq, D) and, when asked for, the weights (B, H, Tq, Tk). With ``group`` G > 1 (cross-attention
        only), ``x`` is (B*G, Tq, D): G consecutive rows per row of ``memory`` (B, Tk, D) and ``key_mask``
        (B, Tk), as beam search's K beams share their sentence's source. With ``packed`` (self-attention
        without a cache), ``x`` is (N, D): the real rows of a padded batch (:mod:`app.attention.packing`),
        and so is the output.
        """
        if packed is not None:
            return self._attend_packed(x, packed, key_mask=key_mask, causal=causal, need_weights=need_weights)
        if group > 1:
            return self._attend_grouped(
                x, memory, key_mask=key_mask, cache=cache, need_weights=need_weights, group=group
            )
        q = self._split(self.q_proj(x), self.num_heads)  # (B, H, Tq, Dh)
        source = x if memory is None else memory
        if cache is not None:
            out = cache.attend(self, q, source, key_mask=key_mask, causal=causal, need_weights=need_weights)
        else:
            k, v = self.project_kv(source, q if memory is None else None)  # (B, Hkv, Tk, Dh)
            out = self.attend(q, k, v, key_mask=key_mask, causal=causal, need_weights=need_weights)
        return self._merge(out.context), out.weights

    def forward_packed(
        self,
        x: Tensor,
        segments: Segments,
        *,
        memory: Tensor | None = None,
        memory_segments: Segments | None = None,
        causal: bool = False,
    ) -> Tensor:
        """Attention over a packed batch (:mod:`app.attention.segments`): ``x`` (Nq, D) the real tokens of the
        query sequences ``segments``; self-attention, or cross-attention to ``memory`` (Nk, D) of
        ``memory_segments`` (the same sequences' sources, in the same order). Returns (Nq, D). Training and
        scoring only: decoding keeps its padded, cached path (:meth:`forward`)."""
        if (memory is None) != (memory_segments is None):
            raise ValueError("cross-attention over a packed batch needs both memory and memory_segments")
        n = x.size(0)
        q = self.q_proj(x).view(n, self.num_heads, self.head_dim)  # (Nq, H, Dh)
        source = x if memory is None else memory
        m = source.size(0)
        v = self.v_proj(source).view(m, self.num_kv_heads, self.head_dim)  # (Nk, Hkv, Dh)
        if self.k_proj is not None:
            k = self.k_proj(source).view(m, self.num_kv_heads, self.head_dim)
        else:  # a shared-QK kernel derives its keys from the queries: (N, H, Dh)
            k = self.kernel.shared_keys(q.transpose(0, 1)[None])[0].transpose(0, 1)
        context = self.kernel.forward_packed(
            q,
            k,
            v,
            q_segments=segments,
            k_segments=segments if memory_segments is None else memory_segments,
            causal=causal,
            dropout_p=self.dropout_p,
        )
        return self.out_proj(context.reshape(n, self.num_heads * self.head_dim))

    @property
    def dropout_p(self) -> float:
        """The attention dropout of a call: ``dropout`` in training, 0 in eval mode."""
        return self.dropout if self.training else 0.0

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        key_mask: Tensor | None,
        causal: bool,
        need_weights: bool,
        key_codes: Tensor | None = None,
    ) -> AttentionOutput:
        """The kernel over ``q`` (B, H, Tq, Dh) and ``k``, ``v`` (B, Hkv, Tk, Dh) with this layer's dropout;
        ``key_codes`` (B, Hkv, Tk, C): the keys' codes a cache kept (``AttentionKernel.key_codes``)."""
        codes = {} if key_codes is None else {"key_codes": key_codes}
        return self.kernel(
            q,
            k,
            v,
            key_mask=key_mask,
            causal=causal,
            dropout_p=self.dropout_p,
            need_weights=need_weights,
            **codes,
        )

    def _attend_grouped(
        self,
        x: Tensor,
        memory: Tensor,
        *,
        key_mask: Tensor | None,
        cache: AttentionCache | None,
        need_weights: bool,
        group: int,
    ) -> tuple[Tensor, Tensor | None]:
        """Cross-attention of ``x`` (B*G, Tq, D) over ``memory`` (B, Tk, D), G query rows per memory row.

        A kernel that ``shares_keys`` sees each sentence's G rows as G*Tq queries of one row, so the keys
        and values (and a static cache) hold B rows, not B*G copies; other kernels get the copies.
        """
        if memory is None:
            raise ValueError(
                f"group={group} needs cross-attention: self-attention has one query row per key row"
            )
        if not self.kernel.capabilities.shares_keys:
            if cache is None or not cache.filled:
                memory = memory.repeat_interleave(group, dim=0)  # (B*G, Tk, D)
            key_mask = None if key_mask is None else key_mask.repeat_interleave(group, dim=0)
            return self.forward(x, memory=memory, key_mask=key_mask, cache=cache, need_weights=need_weights)
        rows, tq, width = x.shape
        out, weights = self.forward(
            x.reshape(rows // group, group * tq, width),  # (B, G*Tq, D)
            memory=memory,
            key_mask=key_mask,
            cache=cache,
            need_weights=need_weights,
        )
        if weights is not None:  # (B, H, G*Tq, Tk) -> (B*G, H, Tq, Tk)
            b, heads, _, tk = weights.shape
            weights = weights.view(b, heads, group, tq, tk).transpose(1, 2).reshape(rows, heads, tq, tk)
        return out.reshape(rows, tq, width), weights

    def _attend_packed(
        self, x: Tensor, packed: PackedRows, *, key_mask: Tensor | None, causal: bool, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Self-attention over the real rows ``x`` (N, D) of a padded batch: the projections see those rows
        only, the kernel the padded (B, H, S, Dh) layout (zeros at the padding, which ``key_mask`` hides)."""

        def heads(projection: nn.Linear, count: int) -> Tensor:
            return self._split(packed.unpack(projection(x)), count)  # (B, count, S, Dh)

        q = heads(self.q_proj, self.num_heads)
        v = heads(self.v_proj, self.num_kv_heads)
        k = heads(self.k_proj, self.num_kv_heads) if self.k_proj is not None else self.kernel.shared_keys(q)
        out = self.attend(q, k, v, key_mask=key_mask, causal=causal, need_weights=need_weights)
        context = packed.pack(out.context.transpose(1, 2))  # (N, H, Dh), gathered from (B, S, H, Dh)
        return self.out_proj(context.flatten(1)), out.weights

    def _merge(self, context: Tensor) -> Tensor:
        """Heads (B, H, Tq, Dh) back to the model width, then the output projection: (B, Tq, D)."""
        b, _, tq, _ = context.shape
        return self.out_proj(context.transpose(1, 2).reshape(b, tq, self.num_heads * self.head_dim))


def check_head_layout(*, d_model: int, num_heads: int, num_kv_heads: int) -> None:
    """Reject head counts that cannot split the model width, naming the values."""
    if num_heads < 1 or d_model % num_heads:
        raise AttentionConfigError(f"num_heads={num_heads} must divide the model width d_model={d_model}")
    if not 1 <= num_kv_heads <= num_heads or num_heads % num_kv_heads:
        raise AttentionConfigError(
            f"num_kv_heads={num_kv_heads} must divide num_heads={num_heads} "
            f"(1 = MQA, {num_heads} = MHA, a divisor in between = GQA)"
        )
