"""Multi-head attention with a configurable number of key/value heads.

One module covers three head layouts (the "mechanism" stays scaled dot-product attention):
MHA (``num_kv_heads == num_heads``, Vaswani et al. 2017), GQA (1 < num_kv_heads < num_heads,
Ainslie et al. 2023) and MQA (``num_kv_heads == 1``, Shazeer 2019). How softmax(QK^T)V is computed
is delegated to an :class:`~app.attention.base.AttentionKernel`.
"""

from __future__ import annotations

from torch import Tensor, nn

from app.attention.base import AttentionKernel, AttentionOutput
from app.attention.cache import KVCache
from app.attention.packing import PackedRows
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
        cache: KVCache | None = None,
        need_weights: bool = False,
        group: int = 1,
        packed: PackedRows | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``x`` (B, Tq, D) to itself, or to ``memory`` (B, Tk, D) for cross-attention.

        ``key_mask`` (B, Tk) marks real keys (for self-attention with a cache: all keys so far).
        With a ``cache``, self-attention appends this step's keys/values; cross-attention computes
        them from ``memory`` once and reuses them on later steps. Causal self-attention through a
        recurrent kernel (``capabilities.recurrent``) keeps the kernel's fixed-size state in the cache
        instead of keys and values. Returns the output (B, Tq, D) and, when asked for, the weights
        (B, H, Tq, Tk). With ``group`` G > 1 (cross-attention only), ``x`` is (B*G, Tq, D): G consecutive
        rows per row of ``memory`` (B, Tk, D) and ``key_mask`` (B, Tk), as beam search's K beams share
        their sentence's source. With ``packed`` (self-attention without a cache), ``x`` is (N, D): the real
        rows of a padded batch (:mod:`app.attention.packing`), and so is the output.
        """
        if packed is not None:
            return self._attend_packed(x, packed, key_mask=key_mask, causal=causal, need_weights=need_weights)
        if group > 1:
            return self._attend_grouped(
                x, memory, key_mask=key_mask, cache=cache, need_weights=need_weights, group=group
            )
        q = self._split(self.q_proj(x), self.num_heads)  # (B, H, Tq, Dh)
        if self._uses_state(cache, causal=causal, cross=memory is not None):
            context = self._recurrent_step(q, x, key_mask=key_mask, cache=cache, need_weights=need_weights)
            return self._merge(context), None
        if cache is not None and cache.static and self.kernel.capabilities.reduces_keys:
            out = self._attend_reduced(q, memory, key_mask=key_mask, cache=cache, need_weights=need_weights)
            return self._merge(out.context), out.weights
        codes = {}  # the cached keys' codes, for kernels that have them (AttentionKernel.key_codes)
        if cache is not None and cache.static and cache.filled:
            k, v = cache.k, cache.v
        else:
            k, v = self.project_kv(x if memory is None else memory, q if memory is None else None)
            if cache is not None:
                k, v = cache.append(k, v, codes=None if cache.static else self.kernel.key_codes(k))
                codes = {} if cache.codes is None else {"key_codes": cache.codes}
        out = self.kernel(
            q,
            k,
            v,
            key_mask=key_mask,
            causal=causal,
            dropout_p=self.dropout if self.training else 0.0,
            need_weights=need_weights,
            **codes,
        )
        return self._merge(out.context), out.weights

    def _attend_grouped(
        self,
        x: Tensor,
        memory: Tensor,
        *,
        key_mask: Tensor | None,
        cache: KVCache | None,
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
        if cache is not None:
            cache.group = group  # its rows are per sentence: select_rows must pick sentences
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
        out = self.kernel(
            q,
            k,
            v,
            key_mask=key_mask,
            causal=causal,
            dropout_p=self.dropout if self.training else 0.0,
            need_weights=need_weights,
        )
        context = packed.pack(out.context.transpose(1, 2))  # (N, H, Dh), gathered from (B, S, H, Dh)
        return self.out_proj(context.flatten(1)), out.weights

    def _merge(self, context: Tensor) -> Tensor:
        """Heads (B, H, Tq, Dh) back to the model width, then the output projection: (B, Tq, D)."""
        b, _, tq, _ = context.shape
        return self.out_proj(context.transpose(1, 2).reshape(b, tq, self.num_heads * self.head_dim))

    def _attend_reduced(
        self, q: Tensor, memory: Tensor, *, key_mask: Tensor | None, cache: KVCache, need_weights: bool
    ) -> AttentionOutput:
        """Attention over a static cache that holds keys and values already reduced along the sequence.

        The first call projects ``memory`` (B, Tk, D) and reduces it (e.g. Linformer's E K and F V, Wang et
        al. 2020, section 4) once per sentence; later decoding steps reuse the reduced (B, Hkv, k, Dh) rows
        and their mask instead of reducing the whole encoder output again.
        """
        if not cache.filled:
            k, v = self.project_kv(memory)  # (B, Hkv, Tk, Dh)
            cache.k, cache.v, cache.key_mask = self.kernel.reduce(k, v, key_mask)  # (B, Hkv, k, Dh), (B, k)
        return self.kernel.attend_reduced(
            q,
            cache.k,
            cache.v,
            cache.key_mask,
            dropout_p=self.dropout if self.training else 0.0,
            need_weights=need_weights,
        )

    def _uses_state(self, cache: KVCache | None, *, causal: bool, cross: bool) -> bool:
        """Whether this call decodes with the kernel's recurrent state rather than a KV cache."""
        return (
            cache is not None
            and not cache.static
            and causal
            and not cross
            and self.kernel.capabilities.recurrent
        )

    def _recurrent_step(
        self, q: Tensor, x: Tensor, *, key_mask: Tensor | None, cache: KVCache, need_weights: bool
    ) -> Tensor:
        """Causal attention of the new positions ``x`` (B, t, D) from ``cache.state``; updates the state.

        The recurrent form of causal linear attention (Katharopoulos et al. 2020, section 3.4): the
        state summarises every earlier key and value in O(1) memory per step, so no K/V is cached.
        ``key_mask`` covers all keys so far (B, Tk) as elsewhere; only its last t columns are new.
        """
        if need_weights:
            raise ValueError(f"the {type(self.kernel).__name__} kernel cannot return attention weights")
        k, v = self.project_kv(x, q)  # (B, Hkv, t, Dh)
        step_mask = None if key_mask is None else key_mask[:, -x.size(1) :]  # (B, t)
        context, cache.state = self.kernel.recurrent_step(cache.state, q, k, v, key_mask=step_mask)
        return context  # (B, H, t, Dh)


def check_head_layout(*, d_model: int, num_heads: int, num_kv_heads: int) -> None:
    """Reject head counts that cannot split the model width, naming the values."""
    if num_heads < 1 or d_model % num_heads:
        raise AttentionConfigError(f"num_heads={num_heads} must divide the model width d_model={d_model}")
    if not 1 <= num_kv_heads <= num_heads or num_heads % num_kv_heads:
        raise AttentionConfigError(
            f"num_kv_heads={num_kv_heads} must divide num_heads={num_heads} "
            f"(1 = MQA, {num_heads} = MHA, a divisor in between = GQA)"
        )
