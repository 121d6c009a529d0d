"""Linformer: keys and values projected along the sequence to ``k`` rows (Wang et al. 2020).

Section 4 of the paper ("Model") replaces each head's softmax(Q K^T / sqrt(d)) V, with its n x n scores, by

    softmax(Q (E K)^T / sqrt(d)) (F V)          E, F: (k, n)

so a query scores ``k`` projected rows instead of ``n`` keys: O(n k) time and memory. E and F are learned
(k, ``max_len``) matrices; a sequence of length n <= max_len uses their first n columns, as Linformer
implementations for variable lengths do. Sharing (``sharing`` option, section 4, "Parameter sharing"):

* ``none``: an E and an F per key/value head of each layer (sized when the layer binds the kernel to its
  head layout, :meth:`~app.attention.base.AttentionKernel.bind`);
* ``headwise``: one E and one F per layer, shared by all heads (the paper's lightest sharing);
* ``key_value``: one matrix per layer serves as both E and F;
* ``layerwise``: one matrix for the whole stack of a site (every layer's E and F), tied by the model
  through :meth:`~app.attention.base.AttentionKernel.tie_to`.

Padding: padded key and value rows are zeroed before the projection, so their values never reach the
output; a projected row built from no real key at all (E's column weights on real positions are all zero,
e.g. an all-padding sentence, or identity projections) is hidden like a padded key, head by head where
each head has its own E and F. With k = n and E = F = identity the kernel is exactly softmax attention,
which the tests check.

Every projected row mixes all positions, future ones included, so causal (decoder self-) attention is
impossible: ``capabilities.causal`` is False and the model refuses that site when it is built. For
cross-attention the projection of the encoder output is computed once per sentence and kept in the
static decoding cache (``capabilities.reduces_keys``). Weights over the projected rows are not weights
over keys, so none are returned.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from app.attention.base import AttentionKernel, AttentionOutput, KernelCapabilities
from app.attention.cache import AttentionCache, ReducedCache
from app.attention.registry import AttentionConfigError, register_kernel

SHARING = ("none", "headwise", "key_value", "layerwise")
CAUSAL_REASON = "each projected key mixes all positions, future ones included, so no causal mask can apply"


@register_kernel("linformer")
class LinformerAttention(AttentionKernel):
    """Low-rank attention over keys and values projected along the sequence; see the module docstring."""

    capabilities = KernelCapabilities(
        padding_mask=True,
        causal=False,
        returns_weights=False,
        incremental=True,  # any number of queries against a (static, reduced) cross-attention cache
        exact=False,
        attention_dropout=True,  # on the weights over the k projected rows
        across_sequences=True,
        reduces_keys=True,
        shares_keys=True,  # queries attend the k reduced rows independently
    )
    reasons: ClassVar[dict[str, str]] = {"causal": CAUSAL_REASON}
    length_option: ClassVar[str | None] = "max_len"  # model.max_positions unless the config sets it

    def __init__(self, *, k: int = 64, sharing: str = "headwise", max_len: int = 256) -> None:
        super().__init__()
        for name, value in {"k": k, "max_len": max_len}.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise AttentionConfigError(f"linformer attention {name}={value!r} must be an integer >= 1")
        if sharing not in SHARING:
            raise AttentionConfigError(
                f"unknown linformer sharing {sharing!r}; valid choices: {', '.join(SHARING)}"
            )
        self.k, self.sharing, self.max_len = k, sharing, max_len
        # std 1/sqrt(k): a projected row of n unit keys has about sqrt(n/k) their norm (the paper gives no
        # initialisation; training learns the scale with the rest).
        self._make_projections(heads=1)

    def _make_projections(self, *, heads: int) -> None:
        """E and F: (heads, k, max_len), heads = 1 (shared by all heads) or one per key/value head."""
        shape = (heads, self.k, self.max_len)
        self.proj_k = nn.Parameter(torch.randn(shape) / math.sqrt(self.k))  # E
        separate = self.sharing in ("none", "headwise")
        self.proj_v = nn.Parameter(torch.randn(shape) / math.sqrt(self.k)) if separate else self.proj_k  # F

    def bind(self, *, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        """``none`` sharing: one E and one F per key/value head of the layer."""
        if self.sharing == "none" and self.proj_k.size(0) != num_kv_heads:
            self._make_projections(heads=num_kv_heads)

    def start_from_softmax(self) -> str:
        """E = F = the identity on the first k positions, 0 beyond (set in place).

        The paper gives no rule for starting from a trained softmax layer. This one makes the converted
        layer *equal* to it for every input of at most k tokens (row i is key i; rows no real key reaches
        are hidden, as padding is), so uptraining starts from the trained model's quality rather than from
        a random mix of positions; positions past k contribute nothing until training learns their columns
        (the gradient reaches them). The pooling the paper names as an alternative (section 4: mean-pooling
        with stride n/k) would average neighbouring keys of every input, short ones included.
        """
        rows = min(self.k, self.max_len)
        with torch.no_grad():
            for proj in {id(p): p for p in (self.proj_k, self.proj_v)}.values():
                proj.zero_()
                diagonal = torch.arange(rows)
                proj[:, diagonal, diagonal] = 1.0  # (heads, k, max_len): E[i, i] = 1, i < rows
        return (
            f"E = F = identity on the first {rows} positions, 0 beyond: inputs of up to {rows} tokens attend "
            f"exactly as the trained softmax layer did, longer ones see their first {rows} until uptraining"
        )

    def extra_repr(self) -> str:
        return f"k={self.k}, sharing={self.sharing}, max_len={self.max_len}"

    def describe(self) -> str:
        """E.g. ``linformer k=64 headwise``."""
        return f"{self.name} k={self.k} {self.sharing}"

    def tie_to(self, first: AttentionKernel) -> None:
        """``layerwise`` sharing: use the first layer's projection (one matrix for E and F, all layers)."""
        if (
            self.sharing == "layerwise"
            and isinstance(first, LinformerAttention)
            and first.sharing == "layerwise"
        ):
            if first.proj_k.shape != self.proj_k.shape:
                raise AttentionConfigError(
                    "linformer layerwise sharing needs one k and max_len per site, got "
                    f"{tuple(first.proj_k.shape)} and {tuple(self.proj_k.shape)}"
                )
            self.proj_k = self.proj_v = first.proj_k

    def scores_per_query(self, length: int, *, head_dim: int) -> int:
        """k projected rows per query, whatever the length (scores, weights and their gradients)."""
        return 4 * self.k

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
        """Attend ``q`` (B, H, Tq, Dh) over ``k``/``v`` (B, Hkv, Tk, Dh) projected to ``self.k`` rows."""
        if causal:
            raise ValueError(f"linformer attention cannot be causal: {CAUSAL_REASON}")
        return self.attend_reduced(
            q, *self.reduce(k, v, key_mask), dropout_p=dropout_p, need_weights=need_weights
        )

    def new_cache(self, *, cross: bool) -> AttentionCache:
        """Cross-attention keeps E K, F V and their mask (:meth:`reduce`), computed once per sentence."""
        return ReducedCache(shared=self.capabilities.shares_keys) if cross else super().new_cache(cross=cross)

    def reduce(self, k: Tensor, v: Tensor, key_mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """E K and F V (B, Hkv, k, Dh) with padded rows zeroed first, and (B, P, k) True for projected rows
        that some real key contributes to (section 4: the linear projection of keys and values); P is
        Hkv where each head has its own E and F (``none`` sharing), else 1."""
        batch, _, length, _ = k.shape
        if length > self.max_len:
            raise ValueError(
                f"linformer attention got {length} keys but its projections cover max_len={self.max_len} "
                "positions: raise model.max_positions, which max_len follows unless attention.max_len "
                "(or attention.sites.<site>.max_len) sets it"
            )
        proj_k = self.proj_k[:, :, :length].to(k.dtype)  # (1 | Hkv, k, Tk)
        proj_v = self.proj_v[:, :, :length].to(v.dtype)
        real = k.new_ones(batch, length) if key_mask is None else key_mask.to(k.dtype)  # (B, Tk)
        k = k * real[:, None, :, None]  # padding rows zeroed: their values cannot leak
        v = v * real[:, None, :, None]
        k_rows = proj_k @ k  # (B, Hkv, k, Dh)
        v_rows = proj_v @ v
        with torch.no_grad():  # which rows a real key reaches, through E (keys) or F (values), per head
            reach = torch.einsum("bt,pkt->bpk", real, proj_k.abs() + proj_v.abs())  # (B, 1 | Hkv, k)
        return k_rows, v_rows, reach > 0

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
        """softmax(Q (E K)^T / sqrt(Dh)) (F V) over the k projected rows (grouped heads share them)."""
        if need_weights:
            raise ValueError("linformer attention has no weights over keys, only over projected rows")
        batch, heads, tq, dim = q.shape
        kv_heads = k.size(1)
        qg = q.view(batch, kv_heads, heads // kv_heads, tq, dim)  # (B, Hkv, G, Tq, Dh)
        scores = qg @ k[:, :, None].transpose(-1, -2) / math.sqrt(dim)  # (B, Hkv, G, Tq, k)
        if key_mask is not None:  # (B, 1 | Hkv, k): a head's rows that no real key reaches are hidden
            visible = key_mask[:, :, None, None, :]  # (B, 1 | Hkv, 1, 1, k)
            scores = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1)
        if key_mask is not None:
            weights = weights * visible  # a sentence with no real key gives zero, never NaN
        if dropout_p > 0:
            weights = F.dropout(weights, p=dropout_p)
        context = weights @ v[:, :, None]  # (B, Hkv, G, Tq, Dh)
        return AttentionOutput(context=context.flatten(1, 2))  # (B, H, Tq, Dh)
