"""Cross-attention caches: keys and values of the encoder output, computed at the first step, then reused."""

from __future__ import annotations

from torch import Tensor

from app.attention.cache.base import AttentionCache, CachedLayer
from app.attention.output import AttentionOutput


class StaticCache(AttentionCache):
    """Cross-attention keys and values (R, Hkv, S, Dh), filled from the encoder output once, never grown.

    ``shared`` (the kernel ``shares_keys``): the rows are per sentence, shared by its G decoder rows (beam
    search's beams attend them as G*Tq queries of one row), so a beam reorder leaves them as they are and
    sentences leaving select them by sentence. Otherwise there is one row per decoder row, as for
    self-attention. Reorders are applied at once (nothing is appended to gather them into).
    """

    key_mask: Tensor | None = None  # (R, 1 | Hkv, k): held by :class:`ReducedCache` itself; None here

    def __init__(self, *, shared: bool = False, k: Tensor | None = None, v: Tensor | None = None) -> None:
        self.shared = shared
        self.k, self.v = k, v  # (R, Hkv, S, Dh) each, None until filled

    @property
    def filled(self) -> bool:
        return self.k is not None

    def replace(self, k: Tensor, v: Tensor) -> None:
        """Store ``k``, ``v`` (R, Hkv, S, Dh), computed elsewhere (the compiled first step), as the cache."""
        self.k, self.v = k, v

    def attend(
        self,
        layer: CachedLayer,
        q: Tensor,
        source: Tensor,
        *,
        key_mask: Tensor | None,
        causal: bool,
        need_weights: bool,
    ) -> AttentionOutput:
        """Attend over the keys/values of ``source`` (R, S, D), the encoder output, projected at the first
        call only. Stored contiguous: every step's product then reads them in place, never copies them."""
        if self.k is None:
            k, v = layer.project_kv(source)  # (R, Hkv, S, Dh), a head-split view of the projection
            self.k, self.v = k.contiguous(), v.contiguous()
        return layer.attend(q, self.k, self.v, key_mask=key_mask, causal=causal, need_weights=need_weights)

    def reorder(self, rows: Tensor) -> None:
        """Keep decoder rows ``rows`` (R',) taken within their sentences: shared rows stay as they are."""
        if not self.shared:
            self.take(rows)

    def select(self, rows: Tensor, sentences: Tensor) -> None:
        """Keep the rows of the sentences ``sentences`` (B',) still decoded (by sentence where shared)."""
        self.take(sentences if self.shared else rows)

    def take(self, index: Tensor) -> None:
        """Keep the cache's own rows ``index``."""
        if self.k is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)

    def nbytes(self) -> int:
        """Bytes held by the cached keys and values."""
        return sum(t.numel() * t.element_size() for t in (self.k, self.v) if t is not None)


class ReducedCache(StaticCache):
    """Cross-attention keys and values reduced along the source, with the mask of the reduced rows.

    For kernels that project keys and values along the sequence (``AttentionKernel.reduce``): Linformer's
    E K and F V (Wang et al. 2020, section 4), linear attention's two sums over the keys. The reduction of
    the whole encoder output is done once per sentence; later steps attend the reduced (R, Hkv, k, Dh) rows
    and their ``key_mask`` (R, 1 | Hkv, k).
    """

    def __init__(
        self,
        *,
        shared: bool = False,
        k: Tensor | None = None,
        v: Tensor | None = None,
        key_mask: Tensor | None = None,
    ) -> None:
        super().__init__(shared=shared, k=k, v=v)
        self.key_mask = key_mask

    def attend(
        self,
        layer: CachedLayer,
        q: Tensor,
        source: Tensor,
        *,
        key_mask: Tensor | None,
        causal: bool,
        need_weights: bool,
    ) -> AttentionOutput:
        """Attend over the reduced keys/values of ``source`` (R, S, D), reduced at the first call only
        (``key_mask`` (R, S) is the source's; later calls use the reduced rows' own)."""
        if self.k is None:
            k, v = layer.project_kv(source)  # (R, Hkv, S, Dh)
            self.k, self.v, self.key_mask = layer.kernel.reduce(k, v, key_mask)  # (R, Hkv, k, Dh), mask
        return layer.kernel.attend_reduced(
            q, self.k, self.v, self.key_mask, dropout_p=layer.dropout_p, need_weights=need_weights
        )

    def take(self, index: Tensor) -> None:
        """Keep the cache's own rows ``index``, of the keys, values and mask."""
        super().take(index)
        if self.key_mask is not None:
            self.key_mask = self.key_mask.index_select(0, index)

    def nbytes(self) -> int:
        """Bytes held by the reduced keys, values and their mask."""
        mask = 0 if self.key_mask is None else self.key_mask.numel() * self.key_mask.element_size()
        return super().nbytes() + mask
