"""Self-attention caches that grow by each step's keys and values (causal decoding)."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from app.attention.cache.base import AttentionCache, CachedLayer
from app.attention.output import AttentionOutput


class KVCache(AttentionCache):
    """Keys and values of the positions decoded so far, (B, Hkv, T, Dh) each.

    Only the key/value heads are stored, so a GQA/MQA layer with fewer kv heads keeps a proportionally
    smaller cache.

    Beam search reorders a growing cache before every step's append. The reorder is held back
    (``pending``) and done by the append, which gathers the kept rows straight into the grown tensor:
    one copy of the cache per step instead of two (a gather, then a concatenation that copies it all
    again). Reading ``k`` or ``v`` in between applies it, so a reader never sees the old rows; a step
    that gathers the rows itself reads them with :meth:`held` and stores its result with :meth:`replace`
    (the compiled ahead-of-time step).
    """

    holds_reorders: ClassVar[bool] = True  # whether a reorder waits for the next append (see above)
    max_len: int | None = None  # the most positions kept (a sliding window's, :class:`WindowCache`)

    def __init__(self, *, k: Tensor | None = None, v: Tensor | None = None) -> None:
        self._k, self._v = k, v
        self.pending: Tensor | None = None  # (R,) the rows of ``_k``/``_v`` a reorder kept, not yet gathered

    @property
    def k(self) -> Tensor | None:
        """Cached keys (B, Hkv, T, Dh)."""
        self._settle()
        return self._k

    @property
    def v(self) -> Tensor | None:
        """Cached values (B, Hkv, T, Dh)."""
        self._settle()
        return self._v

    @property
    def filled(self) -> bool:
        return self._k is not None

    def length(self) -> int:
        """Cached key positions."""
        return 0 if self._k is None else self._k.size(2)

    def _settle(self) -> None:
        """Apply a held-back reorder."""
        if self.pending is not None:
            index, self.pending = self.pending, None
            self._k, self._v = self._k.index_select(0, index), self._v.index_select(0, index)

    def held(self) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """The stored keys, values and held-back reorder (rows of them to keep, or None), left as they are:
        for a step that gathers the rows itself while it appends (the compiled ahead-of-time step)."""
        return self._k, self._v, self.pending

    def replace(self, k: Tensor, v: Tensor) -> None:
        """Store ``k``, ``v`` (B, Hkv, T, Dh) as the whole cache: a held-back reorder is dropped, not
        applied (the new tensors were computed from the kept rows)."""
        self._k, self._v, self.pending = k, v, None

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
        """Append the keys/values of ``source`` (B, t, D), then attend over all of them."""
        k, v = self.append(*layer.project_kv(source, q))  # (B, Hkv, T, Dh)
        return layer.attend(q, k, v, key_mask=key_mask, causal=causal, need_weights=need_weights)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add the new step's keys/values (B, Hkv, t, Dh) and return the full cached tensors."""
        if self._k is None:  # stored contiguous: a step's product then reads it in place, never copies it
            self._k, self._v = k.contiguous(), v.contiguous()
        elif self.pending is not None and not k.requires_grad and k.dtype == self._k.dtype:
            self._k, self._v = (gathered(old, self.pending, new) for old, new in ((self._k, k), (self._v, v)))
            self.pending = None
        else:
            self._settle()
            self._k, self._v = torch.cat([self._k, k], dim=2), torch.cat([self._v, v], dim=2)
        return self._k, self._v

    def reorder(self, rows: Tensor) -> None:
        """Select batch rows (beam search keeps the surviving hypotheses): held back until the next append
        where it can be (not under autograd, whose tape would keep the held copies)."""
        if self._k is None:
            return
        if self.holds_reorders and not self._k.requires_grad:
            self.pending = rows if self.pending is None else self.pending.index_select(0, rows)
        else:
            self._settle()
            self._k, self._v = self._k.index_select(0, rows), self._v.index_select(0, rows)

    def nbytes(self) -> int:
        """Bytes held by the cached keys and values (a held-back reorder applied first)."""
        return sum(t.numel() * t.element_size() for t in (self.k, self.v) if t is not None)


class WindowCache(KVCache):
    """The last ``max_len`` positions only: a causal sliding window (``SparseAttention.cache_window``).

    Trimmed by every append, so a reorder is applied at once rather than gathered into the append.
    """

    holds_reorders: ClassVar[bool] = False

    def __init__(self, *, max_len: int, k: Tensor | None = None, v: Tensor | None = None) -> None:
        super().__init__(k=k, v=v)
        self.max_len = max_len

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add the step's keys/values (B, Hkv, t, Dh), then drop all but the last ``max_len`` positions."""
        k, v = super().append(k, v)
        if k.size(2) > self.max_len:
            self._k, self._v = k[:, :, -self.max_len :], v[:, :, -self.max_len :]  # (B, Hkv, max_len, Dh)
        return self._k, self._v


class CodedKVCache(KVCache):
    """Keys and values with each key's codes beside them (``AttentionKernel.key_codes``, LSH: its buckets
    in every round), so a step computes the codes of its new keys only.

    ``codes`` (B, Hkv, T, C) are kept only while they cover every cached key: a cache that began without
    them, or whose tensors were replaced from outside (a compiled step), keeps none, and the kernel then
    computes them itself.
    """

    def __init__(self, *, k: Tensor | None = None, v: Tensor | None = None) -> None:
        super().__init__(k=k, v=v)
        self.codes: Tensor | None = None  # (B, Hkv, T, C)

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
        """Append the keys/values of ``source`` (B, t, D) and their codes, then attend over all keys."""
        k, v = layer.project_kv(source, q)  # (B, Hkv, t, Dh)
        k, v = self.append(k, v, codes=layer.kernel.key_codes(k))
        return layer.attend(
            q, k, v, key_mask=key_mask, causal=causal, need_weights=need_weights, key_codes=self.codes
        )

    def append(self, k: Tensor, v: Tensor, codes: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Add the step's keys/values (B, Hkv, t, Dh) and the codes (B, Hkv, t, C) of its keys."""
        if codes is None or (self.filled and self.codes is None):
            self.codes = None
        else:
            self.codes = codes if self.codes is None else torch.cat([self.codes, codes], dim=2)
        return super().append(k, v)

    def replace(self, k: Tensor, v: Tensor) -> None:
        """Store ``k``, ``v`` as the whole cache (see :meth:`KVCache.replace`); the codes are dropped."""
        super().replace(k, v)
        self.codes = None

    def reorder(self, rows: Tensor) -> None:
        """Select batch rows: the keys' reorder held back (:class:`KVCache`), the codes' applied."""
        super().reorder(rows)
        if self.codes is not None:
            self.codes = self.codes.index_select(0, rows)

    def nbytes(self) -> int:
        """Bytes held by the cached keys, values and codes."""
        codes = 0 if self.codes is None else self.codes.numel() * self.codes.element_size()
        return super().nbytes() + codes


def gathered(cached: Tensor, index: Tensor, new: Tensor) -> Tensor:
    """Rows ``index`` (R,) of ``cached`` (B, H, T, Dh), then ``new`` (R, H, t, Dh): (R, H, T+t, Dh), the rows
    gathered straight into place (one copy, where index_select then cat make two)."""
    _, heads, length, width = cached.shape
    out = cached.new_empty(index.numel(), heads, length + new.size(2), width)
    torch.index_select(cached, 0, index, out=out[:, :, :length])
    out[:, :, length:] = new
    return out
