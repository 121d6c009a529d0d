"""Sparse attention: each query sees a fixed pattern of keys (Child et al. 2019, Beltagy et al. 2020
"Longformer", Zaheer et al. 2020 "Big Bird"), computed a block of queries at a time or as FlexAttention
block sparsity.

The patterns (``pattern`` option) and their settings are defined once, in
:mod:`app.attention.kernels.sparse_patterns` (re-exported here), with the positions they relate (query and
key positions within one sequence, so no cross-attention) and which of them survive a truncated cache;
this module computes attention under them.

``backend=blockwise`` (the default) never forms the Tq x Tk score matrix: queries go ``block`` positions at
a time, and each block gathers only the keys its pattern may reach -- a slab shared by the whole block
(band, own or random blocks, global keys, summary columns) plus, for ``strided``, one column of
every-``stride``-th keys per query -- scores that, masks it exactly with :func:`pattern_visible`, and takes
one softmax over the union. For a fixed window, memory therefore grows linearly with the sequence length.

``backend=flex`` hands the same :func:`pattern_visible` to FlexAttention as its ``mask_mod``
(:mod:`app.attention.kernels.flex_ops`): a block mask skips every (128 x 128) tile the pattern leaves empty,
so on a GPU the cost falls with the window instead of paying one small kernel launch per query block. It
also attends packed batches without padding (:meth:`SparseAttention.forward_packed`). Decoding steps (one
query), calls asking for weights, and calls the pattern covers whole keep the paths above.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from app.attention.base import AttentionKernel, AttentionOutput, KernelCapabilities
from app.attention.kernels import flex_ops
from app.attention.kernels.eager import EagerAttention
from app.attention.kernels.sparse_patterns import (  # noqa: F401 (re-exported: the patterns' public names)
    _BANDED,
    PATTERNS,
    SparsePattern,
    pattern_covers_all,
    pattern_mask,
    pattern_table,
    pattern_visible,
    random_key_blocks,
)
from app.attention.registry import AttentionConfigError, register_kernel
from app.attention.segments import Segments

BACKENDS = ("blockwise", "flex")


# --- which keys a block of queries gathers ------------------------------------------------------------


def _shared_keys(
    settings: SparsePattern, p0: int, p1: int, *, tk: int, causal: bool, device: torch.device
) -> Tensor:
    """Sorted key indices (S,) that queries at positions p0..p1 may reach, except strided columns."""
    s = settings
    hi = min(tk, p1 + 1) if causal else tk  # keys at or beyond hi are never visible to this block
    if hi <= 0:
        return torch.empty(0, dtype=torch.long, device=device)
    if p0 < s.num_global:  # a global query sees everything: this block is computed densely
        return torch.arange(hi, device=device)
    pieces = [torch.arange(min(s.num_global, hi), device=device)]
    if s.pattern in _BANDED:
        pieces.append(torch.arange(max(0, p0 - s.window), min(hi, p1 + s.window + 1), device=device))
    if s.pattern == "fixed":
        first = max(0, (p0 // s.stride) * s.stride)
        pieces.append(torch.arange(first, min(hi, (p1 // s.stride + 1) * s.stride), device=device))
        starts = torch.arange(0, hi, s.stride, device=device)[:, None]
        columns = (starts + torch.arange(s.stride - s.summary, s.stride, device=device)).flatten()
        pieces.append(columns[columns < hi])
    if s.pattern == "random_blocks":
        num_key_blocks = math.ceil(tk / s.block)
        for qb in range(p0 // s.block, p1 // s.block + 1):
            for kb in random_key_blocks(s, qb, num_key_blocks=num_key_blocks, causal=causal):
                pieces.append(torch.arange(kb * s.block, min(hi, (kb + 1) * s.block), device=device))
    return torch.unique(torch.cat(pieces))  # sorted, each key once


def _strided_keys(settings: SparsePattern, p: Tensor, *, tk: int) -> tuple[Tensor, Tensor]:
    """Per-query strided columns: indices (R, n) of keys j = p mod stride + t * stride, and which exist."""
    stride = settings.stride
    count = math.ceil(tk / stride)
    index = torch.remainder(p, stride)[:, None] + stride * torch.arange(count, device=p.device)  # (R, n)
    return index.clamp(max=tk - 1), index < tk


def _query_blocks(settings: SparsePattern, tq: int, offset: int) -> Iterator[tuple[int, int]]:
    """(start, end) query index ranges whose positions i + offset fall in one ``block``-aligned block."""
    block = settings.block
    for b in range(offset // block, (offset + tq - 1) // block + 1):
        yield max(0, b * block - offset), min(tq, (b + 1) * block - offset)


# --- the kernel ---------------------------------------------------------------------------------------

# Where the pattern hides nothing, the sparse kernel is dense attention: the reference kernel's few large
# operations then beat gathering keys per query block (a sentence shorter than the window, and every
# decoding step once a sliding window's cache is truncated to window + 1 keys). Stateless, so shared.
_DENSE = EagerAttention()


@register_kernel("sparse")
class SparseAttention(AttentionKernel):
    """Softmax attention restricted to a sparse pattern, computed blockwise (see the module docstring)."""

    # Not exact: softmax over a restricted set of keys (equal to eager only if the pattern covers them all).
    # Not across sequences: a pattern of positions means nothing between a target and a source position
    # (and a cached decoding step would see another pattern than the full pass), so cross stays dense.
    capabilities = KernelCapabilities(
        padding_mask=True,
        causal=True,
        returns_weights=True,
        incremental=True,
        exact=False,
        across_sequences=False,
    )

    def __init__(
        self,
        *,
        pattern: str = "sliding_window",
        window: int = 64,
        stride: int = 32,
        summary: int = 1,
        num_global: int = 0,
        block: int = 64,
        num_random_blocks: int = 2,
        seed: int = 0,
        recompute: bool = False,
        backend: str = "blockwise",
    ) -> None:
        super().__init__()
        if backend not in BACKENDS:
            raise AttentionConfigError(
                f"unknown sparse attention backend {backend!r}; valid choices: {', '.join(BACKENDS)}"
            )
        self.backend = backend  # how the pattern is computed: query blocks, or FlexAttention block sparsity
        # recompute: keep no per-block scores for the backward pass, recompute them there instead
        # (activation checkpointing per query block): training memory then grows with T x Dh, not with
        # T x (block + 2 window), for ~1/3 more compute.
        self.recompute = bool(recompute)
        self.settings = SparsePattern(
            pattern=pattern,
            window=window,
            stride=stride,
            summary=summary,
            num_global=num_global,
            block=block,
            num_random_blocks=num_random_blocks,
            seed=seed,
        )

    def extra_repr(self) -> str:
        return f"{self.settings!r}, recompute={self.recompute}, backend={self.backend!r}"

    def cache_window(self) -> int | None:
        """``window + 1`` for a causal sliding window: the query itself and the ``window`` keys before it.

        WindowCache appends the step's key before truncating, so a cache of ``window + 1`` positions holds
        exactly the keys the newest query may see. Global tokens and position-dependent patterns need
        every key, hence None.
        """
        s = self.settings
        return s.window + 1 if s.pattern == "sliding_window" and s.num_global == 0 else None

    def describe(self) -> str:
        """The pattern and the settings it reads, e.g. ``sparse strided window=8 stride=4``."""
        s = self.settings
        parts = [self.name, s.pattern]
        if s.pattern in _BANDED:
            parts.append(f"window={s.window}")
        if s.pattern in ("strided", "fixed"):
            parts.append(f"stride={s.stride}")
        if s.pattern == "fixed":
            parts.append(f"summary={s.summary}")
        if s.pattern == "random_blocks":
            parts.append(f"random={s.num_random_blocks}x{s.block}")
        if s.num_global:
            parts.append(f"global={s.num_global}")
        if self.backend != "blockwise":
            parts.append(f"backend={self.backend}")
        return " ".join(parts)

    def scores_per_query(self, length: int, *, head_dim: int) -> int:
        """Scores of the keys a query block gathers (its band and block), kept with their gradients;
        ``backend=flex``: all of them, as :meth:`FlexAttention.scores_per_query` says why."""
        if self.backend == "flex":
            return 4 * length
        return 6 * min(length, 2 * self.settings.window + 2 * self.settings.block)

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
        batch, heads, tq, dim = q.shape
        kv_heads, tk = k.size(1), k.size(2)
        if tq and pattern_covers_all(self.settings, tq, tk):  # e.g. a decoding step over a window's cache
            return _DENSE(
                q, k, v, key_mask=key_mask, causal=causal, dropout_p=dropout_p, need_weights=need_weights
            )
        if self.backend == "flex" and tq > 1 and not need_weights:  # weights and steps: blockwise
            return AttentionOutput(context=self._attend_flex(q, k, v, key_mask, causal, dropout_p))
        qg = q.unflatten(1, (kv_heads, heads // kv_heads)) / math.sqrt(dim)  # (B, Hkv, G, Tq, Dh)
        contexts, weights = [], []
        offset = tk - tq  # query i sits at position i + offset
        recompute = self.recompute and torch.is_grad_enabled() and not need_weights
        for start, end in _query_blocks(self.settings, tq, offset) if tq else ():
            args = (qg[:, :, :, start:end], k, v, start + offset, key_mask, causal, dropout_p, need_weights)
            if recompute:  # the RNG state is replayed, so dropout masks match between the two passes
                context = checkpoint(self._attend_block_context, *args, use_reentrant=False)
                block_weights = None
            else:
                context, block_weights = self._attend_block(*args)
            contexts.append(context)
            weights.append(block_weights)
        if not contexts:
            context = q.new_zeros(batch, heads, 0, v.size(-1))
            return AttentionOutput(
                context=context, weights=q.new_zeros(batch, heads, 0, tk) if need_weights else None
            )
        context = torch.cat(contexts, dim=3).flatten(1, 2)  # (B, H, Tq, Dv)
        dense = torch.cat(weights, dim=3).flatten(1, 2) if need_weights else None  # (B, H, Tq, Tk)
        return AttentionOutput(context=context, weights=dense)

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
        """``backend=flex``: packed q (Nq, H, Dh) over k, v (Nk, Hkv, Dh) under the pattern within each
        sequence, positions restarting per sequence and ``Tk`` the longest sequence's length (what the
        padded layout of the default gives); (Nq, H, Dv). The blockwise backend takes the padded layout."""
        if self.backend != "flex":
            return super().forward_packed(
                q, k, v, q_segments=q_segments, k_segments=k_segments, causal=causal, dropout_p=dropout_p
            )
        _check_flex_dropout(dropout_p)
        s, tk = self.settings, k_segments.longest
        q_ids, q_pos = q_segments.ids, q_segments.positions
        k_ids, k_pos = k_segments.ids, k_segments.positions
        table = pattern_table(s, tk=tk, causal=causal, device=q.device)

        def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            visible = pattern_visible(s, q_pos[q_idx], k_pos[kv_idx], tk=tk, causal=causal, table=table)
            return visible & (q_ids[q_idx] == k_ids[kv_idx])

        context = flex_ops.attend(
            q.transpose(0, 1)[None],  # (1, H, Nq, Dh): one row holds every sequence
            k.transpose(0, 1)[None],  # (1, Hkv, Nk, Dh)
            v.transpose(0, 1)[None],
            mask_mod,
            batch=None,
            compile="auto",
            owners=(q_ids, q_pos, k_ids, k_pos),
            settings=("sparse packed", s, tk, causal),
        )
        return context[0].transpose(0, 1)  # (Nq, H, Dv)

    def flex_mask_mod(
        self, *, tq: int, tk: int, key_mask: Tensor | None, causal: bool, device: torch.device
    ) -> flex_ops.MaskMod:
        """The pattern of a (Tq, Tk) call, with key padding (``key_mask`` (B, Tk)) and causality, as a
        FlexAttention ``mask_mod``: :func:`pattern_visible` itself, queries at positions i + Tk - Tq."""
        s, offset = self.settings, tk - tq
        table = pattern_table(s, tk=tk, causal=causal, device=device)

        def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            visible = pattern_visible(s, q_idx + offset, kv_idx, tk=tk, causal=causal, table=table)
            return visible if key_mask is None else visible & key_mask[b, kv_idx]

        return mask_mod

    def _attend_flex(
        self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, causal: bool, dropout_p: float
    ) -> Tensor:
        """The pattern (and key padding) as a FlexAttention block mask: q (B, H, Tq, Dh) -> (B, H, Tq, Dv)."""
        _check_flex_dropout(dropout_p)
        tq, tk = q.size(2), k.size(2)
        mask_mod = self.flex_mask_mod(tq=tq, tk=tk, key_mask=key_mask, causal=causal, device=q.device)
        batch = None if key_mask is None else q.size(0)
        owners = () if key_mask is None else (key_mask,)
        key = ("sparse", self.settings, causal)
        return flex_ops.attend(q, k, v, mask_mod, batch=batch, compile="auto", owners=owners, settings=key)

    def _attend_block_context(self, *args: object) -> Tensor:
        return self._attend_block(*args)[0]  # type: ignore[arg-type]

    def _attend_block(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        first: int,
        key_mask: Tensor | None,
        causal: bool,
        dropout_p: float,
        need_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """One block of (already scaled) queries q (B, Hkv, G, R, Dh) at positions ``first``, ``first + 1``...

        Returns the context (B, Hkv, G, R, Dv) and, if asked, the dense weights (B, Hkv, G, R, Tk).
        """
        s, tk = self.settings, k.size(2)
        last = first + q.size(3) - 1
        positions = torch.arange(first, last + 1, device=q.device)  # (R,)
        p = positions[:, None]  # (R, 1)
        shared = _shared_keys(s, first, last, tk=tk, causal=causal, device=q.device)  # (S,)
        mask = pattern_visible(s, p, shared[None, :], tk=tk, causal=causal)[None]  # (1, R, S)
        if key_mask is not None:
            mask = mask & key_mask[:, None, shared]  # (B, R, S)
        k_shared, v_shared = k[:, :, shared], v[:, :, shared]  # (B, Hkv, S, D)
        scores = torch.einsum("bkgrd,bksd->bkgrs", q, k_shared)  # (B, Hkv, G, R, S)
        masks = [mask]
        rows = None
        if s.pattern == "strided":  # per-query columns, minus the keys the shared slab already holds
            rows, exists = _strided_keys(s, positions, tk=tk)  # (R, n)
            row_mask = exists & ~torch.isin(rows, shared) & pattern_visible(s, p, rows, tk=tk, causal=causal)
            row_mask = row_mask[None] if key_mask is None else row_mask & key_mask[:, rows]  # (B|1, R, n)
            k_rows = k[:, :, rows]  # (B, Hkv, R, n, Dh)
            scores = torch.cat([scores, torch.einsum("bkgrd,bkrnd->bkgrn", q, k_rows)], dim=-1)
            masks.append(row_mask)
        mask = torch.cat([m.expand(scores.size(0), -1, -1) for m in masks], dim=-1)[:, None, None]
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1) * mask  # rows without a visible key become zero, not NaN
        attn = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
        width = shared.numel()
        context = attn[..., :width] @ v_shared[:, :, None]  # (B, Hkv, G, R, Dv)
        if rows is not None:
            context = context + torch.einsum("bkgrn,bkrnd->bkgrd", attn[..., width:], v[:, :, rows])
        if not need_weights:
            return context, None
        dense = weights.new_zeros(*weights.shape[:4], tk)  # (B, Hkv, G, R, Tk)
        dense[..., shared] = weights[..., :width]
        if rows is not None:  # hidden or duplicated columns carry weight 0, so adding is safe
            dense = dense.scatter_add(-1, rows.expand(*weights.shape[:3], -1, -1), weights[..., width:])
        return context, dense


def _check_flex_dropout(dropout_p: float) -> None:
    if dropout_p > 0:
        raise ValueError(
            f"sparse attention backend=flex cannot apply attention dropout (dropout={dropout_p}; "
            "FlexAttention has none): set attention.dropout=0, or backend=blockwise"
        )
