"""The interface every decoding cache answers, and what a cache needs of the layer it serves."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Protocol

from torch import Tensor

from app.attention.output import AttentionOutput


class CacheKernel(Protocol):
    """The kernel hooks the caches call (all defined on ``AttentionKernel``; each cache kind uses its own).

    Named here as a protocol because the kernels make the caches: the caches do not import the kernels.
    """

    def key_codes(self, k: Tensor) -> Tensor | None:
        """Per-key codes (B, Hkv, T, C) of keys (B, Hkv, T, Dh), or None (see ``AttentionKernel``)."""
        ...

    def reduce(self, k: Tensor, v: Tensor, key_mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None]:
        """Keys and values reduced along the sequence, with the mask of the reduced rows."""
        ...

    def attend_reduced(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_mask: Tensor | None,
        *,
        dropout_p: float = 0.0,
        need_weights: bool = False,
    ) -> AttentionOutput:
        """Attention over what :meth:`reduce` returned."""
        ...

    def recurrent_step(
        self, state: Any, q: Tensor, k: Tensor, v: Tensor, *, key_mask: Tensor | None = None
    ) -> tuple[Tensor, Any]:
        """Causal attention of the next positions from the state of the earlier ones; the new state."""
        ...


class CachedLayer(Protocol):
    """What a cache needs of the attention layer it serves (a ``MultiHeadAttention``)."""

    kernel: CacheKernel

    @property
    def dropout_p(self) -> float:
        """The attention dropout of this call (0 in eval mode)."""
        ...

    def project_kv(self, memory: Tensor, queries: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Keys and values (B, Hkv, T, Dh) of ``memory`` (B, T, D)."""
        ...

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
        """The kernel over q (B, H, Tq, Dh) and k, v (B, Hkv, Tk, Dh), with the layer's dropout."""
        ...


class AttentionCache(ABC):
    """One attention layer's decoding state, of the kind its kernel keeps.

    A layer hands each call to its cache (:meth:`attend`), which adds what the call brings (a step's keys,
    or the encoder output once) and attends with what it holds, so the layer never asks which kind it has.
    Rows: self-attention caches hold one row per decoder row (B*G for G beams per sentence); a
    cross-attention cache one per decoder row or, shared by a sentence's beams, one per sentence.
    """

    @property
    @abstractmethod
    def filled(self) -> bool:
        """Whether the cache holds anything yet (False before the first step)."""

    @abstractmethod
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
        """Attend ``q`` (B, H, Tq, Dh) with this cache, first adding what ``source`` brings.

        ``source`` is the step's input (B, t, D) for self-attention, whose keys and values join the
        cache, or the encoder output (B, S, D) for cross-attention, read only while the cache is empty.
        ``key_mask`` (B, Tk) marks real keys (self-attention: all keys so far).
        """

    @abstractmethod
    def reorder(self, rows: Tensor) -> None:
        """Keep decoder rows ``rows`` (R',), each taken from a row of its own sentence (a beam search
        reorder, or one row per sentence widened to its beams)."""

    def select(self, rows: Tensor, sentences: Tensor) -> None:
        """Keep decoder rows ``rows`` (R',) of the sentences ``sentences`` (B',) still decoded: whole
        sentences leave. A cache with a row per decoder row keeps ``rows``."""
        self.reorder(rows)

    @abstractmethod
    def nbytes(self) -> int:
        """Bytes held by the cache's tensors."""
