"""The attention kernel contract shared by every implementation.

A *kernel* computes softmax(Q K^T / sqrt(d)) V (or an approximation of it) for already projected,
head-split tensors. Projections, head layout (MHA / GQA / MQA) and caching live in
:mod:`app.attention.multihead`; kernels only see tensors of shape

    q: (B, H, Tq, Dh)      k, v: (B, Hkv, Tk, Dh)      with H % Hkv == 0

Masks use one convention everywhere: ``key_mask`` is a bool tensor of shape (B, Tk), True for real
tokens and False for padding. ``causal=True`` lets query i attend keys j <= i + (Tk - Tq), i.e. the
queries are the *last* Tq positions of the key sequence, which covers both full training (Tq == Tk)
and cached incremental decoding (Tq == 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from app.attention.cache import AttentionCache, KVCache, StaticCache, WindowCache
from app.attention.output import AttentionOutput
from app.attention.segments import Segments


@dataclass(frozen=True)
class KernelCapabilities:
    """What a kernel supports; checked when a model is built, not at run time."""

    padding_mask: bool = True
    causal: bool = True
    returns_weights: bool = True
    incremental: bool = True  # can run with Tq < Tk against a KV cache
    exact: bool = True  # computes full softmax attention (equals the eager reference); False for
    # approximations (linear feature maps) and restricted patterns (sparse)
    recurrent: bool = False  # causal decoding carries a fixed-size state (recurrent_step) instead of K/V
    attention_dropout: bool = True  # can apply dropout to attention weights (dropout_p > 0)
    across_sequences: bool = True  # can attend from one sequence to another (cross-attention); False for
    # patterns of query/key positions, which a target and a source position do not share (sparse)
    reduces_keys: bool = False  # projects keys/values along the sequence (:meth:`AttentionKernel.reduce`,
    # linformer): a static (cross-attention) cache then holds the reduced form, computed once per sentence
    shares_keys: bool = False  # without a causal mask, each query attends independently of the others, so
    # several query rows may share one row of keys/values: beam search's K beams of a sentence then attend
    # its cross-attention keys as K queries of one row instead of K copies of the keys


class AttentionKernel(nn.Module):
    """Base class of all kernels: one signature, one result type, declared capabilities.

    A kernel also describes itself (:meth:`describe`, :meth:`cache_bytes`, :meth:`scores_per_query`), so
    reports and benchmarks need no branch per kernel name.
    """

    capabilities: ClassVar[KernelCapabilities] = KernelCapabilities()
    name: ClassVar[str] = ""  # the registered name, set by :func:`app.attention.registry.register_kernel`
    # Why a capability is missing, by KernelCapabilities field: shown when a site that needs it is refused.
    reasons: ClassVar[dict[str, str]] = {}
    # The option that must cover the longest sequence the model accepts (linformer's ``max_len``): where
    # the config leaves it out, at any site, it is the model's ``max_positions`` (config.site_specs).
    length_option: ClassVar[str | None] = None
    # True when the kernel's keys are its queries (:meth:`shared_keys`, Reformer's shared-QK attention): the
    # layer then has no key projection. A setting of the kernel, so an instance attribute where it is set.
    shared_qk: bool = False

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
        """Attend ``q`` (B, H, Tq, Dh) over ``k``/``v`` (B, Hkv, Tk, Dh); see the module docstring."""
        raise NotImplementedError

    def forward_packed(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        q_segments: Segments,
        k_segments: Segments,
        causal: bool = False,
        dropout_p: float = 0.0,
    ) -> Tensor:
        """Attend packed queries ``q`` (Nq, H, Dh) over packed keys and values ``k``, ``v`` (Nk, Hkv, Dh):
        each query sees only the keys of its own sequence (``q_segments`` and ``k_segments`` hold the same
        number of sequences, in the same order), and with ``causal`` only those at its position or before.
        Returns the context (Nq, H, Dh). No padding exists in a packed batch, so no mask is built here.

        This default runs :meth:`forward` on the padded (B, H, S, Dh) layout of the same sequences (zeros at
        the padding, which its key mask hides) and packs the context back: every kernel accepts a packed
        batch and gives what it gives on the padded one. Kernels with a padding-free form (flex) override it.
        """
        queries, keys = q_segments.padded(), k_segments.padded()
        out = self(
            queries.unpack(q).transpose(1, 2),  # (B, H, Sq, Dh)
            keys.unpack(k).transpose(1, 2),  # (B, Hkv, Sk, Dh)
            keys.unpack(v).transpose(1, 2),
            # causal: a real query sees real keys only (sequences are right-padded), as in decoder training
            key_mask=None if causal else k_segments.key_mask(),
            causal=causal,
            dropout_p=dropout_p,
        )
        return queries.pack(out.context.transpose(1, 2))  # (Nq, H, Dh)

    def cache_window(self) -> int | None:
        """How many past positions a decoder self-attention cache must keep (None = all)."""
        return None

    def new_cache(self, *, cross: bool) -> AttentionCache:
        """A fresh decoding cache of the kind this kernel keeps, for one layer.

        ``cross``: cross-attention's, filled from the encoder output once (shared by a sentence's beams
        where the kernel ``shares_keys``); else causal self-attention's, grown a step at a time (the last
        :meth:`cache_window` positions only where the kernel truncates it). Kernels with other state (a
        recurrent state, reduced keys, per-key codes) override this.
        """
        if cross:
            return StaticCache(shared=self.capabilities.shares_keys)
        window = self.cache_window()
        return KVCache() if window is None else WindowCache(max_len=window)

    def describe(self) -> str:
        """A short label of the kernel and its main settings, e.g. ``sparse sliding_window window=8``."""
        return self.name

    def cache_bytes(self, length: int, *, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """Bytes a decoder self-attention layer's cache holds per sentence after ``length`` generated tokens.

        Keys and values of ``num_kv_heads`` heads (so GQA/MQA shrink it by num_heads / num_kv_heads), for
        the last :meth:`cache_window` positions only when the kernel truncates its cache. Recurrent
        kernels override this with their fixed-size state.
        """
        window = self.cache_window()
        kept = length if window is None else min(length, window)
        return 2 * num_kv_heads * kept * head_dim * dtype.itemsize  # k and v: (Hkv, kept, Dh) each

    def scores_per_query(self, length: int, *, head_dim: int) -> int:
        """About how many score-sized numbers one query row keeps through forward+backward over ``length``
        keys: explicit scores, weights and their gradients (4 x length here). Benchmarks use it to skip
        runs that cannot fit; fused and blockwise kernels override it."""
        return 4 * length

    def bind(self, *, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        """Learn the head layout of the layer that uses the kernel (called once, when the layer is built),
        for kernels whose parameters depend on it (linformer ``sharing=none``); default: nothing."""

    def tie_to(self, first: AttentionKernel) -> None:
        """Share parameters with ``first``, the kernel of the same site in the stack's first layer, when the
        kernel's settings ask for it (linformer ``sharing=layerwise``). The model calls it for every later
        layer; kernels without parameters ignore it."""

    def start_from_softmax(self) -> str:
        """Set the kernel's own parameters so that a layer converted from a trained softmax layer
        (``init_from`` with another kernel, :mod:`app.attention.convert`) starts as close to it as the kernel
        allows, and say in words what was done; kernels without parameters only say so."""
        return "no kernel parameters: the trained projections are taken as they are"

    def key_codes(self, k: Tensor) -> Tensor | None:
        """Integer codes (B, Hkv, T, C) the kernel derives from each key (B, Hkv, T, Dh) alone, for a decoding
        cache to keep beside the keys, so that a step computes them for its new keys only (lsh: each key's
        bucket in every round); None (the default) for kernels without such codes. A kernel that has them
        gets the cached codes of all its keys back as ``forward(..., key_codes=)``."""
        return None

    def shared_keys(self, q: Tensor) -> Tensor:
        """The keys (B, H, T, Dh) a kernel with ``shared_qk`` derives from its queries (B, H, T, Dh)."""
        raise NotImplementedError(f"{type(self).__name__} does not share queries and keys (shared_qk)")

    def reduce(self, k: Tensor, v: Tensor, key_mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None]:
        """Keys and values (B, Hkv, Tk, Dh) reduced along the sequence, with the mask of the reduced rows.

        Only kernels whose ``capabilities.reduces_keys`` is True implement it, with :meth:`attend_reduced`:
        ``forward`` is ``attend_reduced(q, *reduce(k, v, key_mask))``, and a static cache keeps the reduced
        form so that cross-attention reduces the encoder output once per sentence.
        """
        raise NotImplementedError(f"{type(self).__name__} does not reduce keys (capabilities.reduces_keys)")

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
        """Attend ``q`` (B, H, Tq, Dh) over keys and values that :meth:`reduce` returned."""
        raise NotImplementedError(f"{type(self).__name__} does not reduce keys (capabilities.reduces_keys)")

    def recurrent_step(
        self, state: Any, q: Tensor, k: Tensor, v: Tensor, *, key_mask: Tensor | None = None
    ) -> tuple[Tensor, Any]:
        """Causal attention of the next t positions from the ``state`` of all earlier ones (None at first).

        Only kernels whose ``capabilities.recurrent`` is True implement it. q (B, H, t, Dh), k and v
        (B, Hkv, t, Dh) and ``key_mask`` (B, t) are the new positions only. Returns the context
        (B, H, t, Dv) and the new state, a :class:`~app.attention.cache.RecurrentState` whose size does
        not grow with the length.
        """
        raise NotImplementedError(f"{type(self).__name__} has no recurrent form (capabilities.recurrent)")


def repeat_kv(x: Tensor, num_heads: int) -> Tensor:
    """Expand (B, Hkv, T, Dh) to (B, H, T, Dh) by sharing each kv head with H / Hkv query heads."""
    kv_heads = x.size(1)
    if kv_heads == num_heads:
        return x
    b, _, t, d = x.shape
    group = num_heads // kv_heads
    return x[:, :, None].expand(b, kv_heads, group, t, d).reshape(b, num_heads, t, d)


def rows_with_keys(mask: Tensor | None) -> Tensor | None:
    """(B, 1|H, Tq, 1) bool: False for query rows that may attend no key at all (their output is zero), from
    a dense mask of any pattern (flex's dense path). Key padding and causality need no dense mask:
    :func:`app.attention.masks.rows_seeing_keys` reads them from the (B, Tk) key mask."""
    return None if mask is None else mask.any(dim=-1, keepdim=True)
