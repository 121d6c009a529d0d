"""Key/value caches for incremental decoding."""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor


class RecurrentState(Protocol):
    """What a recurrent kernel's decoding state offers, e.g. :class:`.kernels.linear.LinearAttentionState`."""

    def reorder(self, index: Tensor) -> Any:
        """The state with batch rows selected by ``index``."""
        ...

    def nbytes(self) -> int:
        """Bytes held by the state's tensors."""
        ...


class KVCache:
    """Keys and values of the positions decoded so far, one per attention layer.

    Shapes are (B, Hkv, T, Dh): only the key/value heads are stored, so a GQA/MQA layer with
    fewer kv heads keeps a proportionally smaller cache. ``static`` caches (cross-attention) are
    filled once from the encoder output and never grow. ``max_len`` (sliding-window attention)
    keeps only the most recent positions.

    Beam search reorders a growing cache before every step's append. The reorder is held back
    (``pending``) and done by the append, which gathers the kept rows straight into the grown tensor:
    one copy of the cache per step instead of two (a gather, then a concatenation that copies it all
    again). Reading ``k`` or ``v`` in between applies it, so a reader never sees the old rows.

    Recurrent kernels (``capabilities.recurrent``, e.g. causal linear attention, Katharopoulos et al.
    2020, section 3.4) keep no keys or values: :class:`~app.attention.multihead.MultiHeadAttention`
    stores their fixed-size ``state`` here instead, so the cache does not grow with the length.
    """

    def __init__(
        self,
        *,
        k: Tensor | None = None,
        v: Tensor | None = None,
        static: bool = False,
        max_len: int | None = None,
        state: Any = None,
        key_mask: Tensor | None = None,
        codes: Tensor | None = None,
        group: int = 1,
    ) -> None:
        self._k, self._v = k, v
        self.static, self.max_len = static, max_len
        self.state: Any = state  # a RecurrentState, or None
        self.key_mask = key_mask  # (B, k): which reduced rows are real, for a static cache of a kernel that
        # reduces keys along the sequence (capabilities.reduces_keys, linformer); None otherwise
        self.codes = codes  # (B, Hkv, T, C) the kernel's per-key codes (AttentionKernel.key_codes, lsh:
        # buckets), kept beside the keys; None when the kernel has none or the cache began without them
        self.group = group  # query rows per cached row: a static cache shared by a sentence's K beams holds
        # one row per sentence (capabilities.shares_keys), so dropping sentences selects its rows by sentence
        self.pending: Tensor | None = None  # (R,) the rows of ``_k``/``_v`` a reorder kept, not yet gathered

    @property
    def k(self) -> Tensor | None:
        """Cached keys (B, Hkv, T, Dh)."""
        self._settle()
        return self._k

    @k.setter
    def k(self, value: Tensor | None) -> None:
        self._settle()
        self._k = value

    @property
    def v(self) -> Tensor | None:
        """Cached values (B, Hkv, T, Dh)."""
        self._settle()
        return self._v

    @v.setter
    def v(self, value: Tensor | None) -> None:
        self._settle()
        self._v = value

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

    @property
    def filled(self) -> bool:
        return self._k is not None

    def length(self) -> int:
        """Cached key positions (0 for a recurrent state, which stores none)."""
        return 0 if self._k is None else self._k.size(2)

    def append(self, k: Tensor, v: Tensor, codes: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Add the new step's keys/values (B, Hkv, t, Dh) and return the full cached tensors.

        ``codes`` (B, Hkv, t, C), the kernel's codes of the new keys, are kept only while they cover every
        cached key: a cache that began without them (one rebuilt from bare tensors) keeps none.
        """
        if codes is None or (self._k is not None and self.codes is None):
            self.codes = None
        else:
            self.codes = codes if self.codes is None else torch.cat([self.codes, codes], dim=2)
        if self._k is None:  # stored contiguous: a step's product then reads it in place, never copies it
            self._k, self._v = k.contiguous(), v.contiguous()
        elif self.pending is not None and not k.requires_grad and k.dtype == self._k.dtype:
            self._k, self._v = (gathered(old, self.pending, new) for old, new in ((self._k, k), (self._v, v)))
            self.pending = None
        else:
            self.k = torch.cat([self.k, k], dim=2)
            self.v = torch.cat([self.v, v], dim=2)
        if self.max_len is not None and self.k.size(2) > self.max_len:
            self.k = self.k[:, :, -self.max_len :]
            self.v = self.v[:, :, -self.max_len :]
            self.codes = None if self.codes is None else self.codes[:, :, -self.max_len :]
        return self.k, self.v

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search keeps the surviving hypotheses)."""
        if self._k is not None and not (self.static or self.max_len is not None or self._k.requires_grad):
            self.pending = index if self.pending is None else self.pending.index_select(0, index)
        elif self._k is not None:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)
        if self.key_mask is not None:
            self.key_mask = self.key_mask.index_select(0, index)
        if self.codes is not None:
            self.codes = self.codes.index_select(0, index)
        if self.state is not None:
            self.state = self.state.reorder(index)

    def nbytes(self) -> int:
        """Bytes held by the cached keys, values and recurrent state."""
        tensors = (t for t in (self.k, self.v, self.key_mask, self.codes) if t is not None)
        held = sum(t.numel() * t.element_size() for t in tensors)
        return held + (self.state.nbytes() if self.state is not None else 0)


def gathered(cached: Tensor, index: Tensor, new: Tensor) -> Tensor:
    """Rows ``index`` (R,) of ``cached`` (B, H, T, Dh), then ``new`` (R, H, t, Dh): (R, H, T+t, Dh), the rows
    gathered straight into place (one copy, where index_select then cat make two)."""
    _, heads, length, width = cached.shape
    out = cached.new_empty(index.numel(), heads, length + new.size(2), width)
    torch.index_select(cached, 0, index, out=out[:, :, :length])
    out[:, :, length:] = new
    return out
