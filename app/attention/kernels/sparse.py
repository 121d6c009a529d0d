"""Sparse attention: each query sees a fixed pattern of keys, computed a block of queries at a time.

Patterns (``pattern`` option), for a query at position ``p`` and a key at position ``j``:

* ``sliding_window``: ``|p - j| <= window`` (Beltagy et al. 2020, "Longformer", section 3.1; our
  ``window`` is one-sided, so a query sees ``2 * window + 1`` keys, or ``window + 1`` when causal).
* ``strided``: the local band above, or ``(p - j) % stride == 0`` (Child et al. 2019, "Generating Long
  Sequences with Sparse Transformers", section 4.2, the union of its two strided heads).
* ``fixed``: keys in the same ``stride``-long block as the query (``p // stride == j // stride``), or one
  of the last ``summary`` positions of any block (Child et al. 2019, section 4.2, "fixed" pattern, c =
  ``summary``).
* ``global_window``: ``sliding_window`` plus ``num_global >= 1`` global tokens (Longformer, section 3.1).
* ``random_blocks``: the local band, plus ``num_random_blocks`` key blocks of ``block`` positions drawn
  for each query block (Zaheer et al. 2020, "Big Bird", section 2); combine with ``num_global`` for the
  full BigBird pattern.

``num_global`` > 0 adds global tokens to any pattern: the first ``num_global`` positions attend to every
key and every query attends to them. ``causal`` and key padding are applied on top of every pattern.

Positions follow :mod:`app.attention.base`: key ``j`` sits at position ``j`` and query ``i`` at
``p = i + (Tk - Tq)``, so cached incremental decoding (Tq = 1) sees the pattern of full recomputation.
With Tq > Tk the first queries get negative positions: they come before every key and are never global.
A cache truncated to the last ``cache_window()`` keys shifts query and key positions alike, which only
the sliding window (a function of ``p - j``) survives; every other pattern needs the whole cache.

The patterns relate positions *within one sequence*: cross-attention, where a target position and a
source position are not comparable, needs a dense kernel (``capabilities.across_sequences`` is False).

Computation never forms the Tq x Tk score matrix: queries go ``block`` positions at a time, and each
block gathers only the keys its pattern may reach -- a slab shared by the whole block (band, own or
random blocks, global keys, summary columns) plus, for ``strided``, one column of every-``stride``-th
keys per query -- scores that, masks it exactly with :func:`pattern_visible`, and takes one softmax
over the union. For a fixed window, memory therefore grows linearly with the sequence length.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from app.attention.base import AttentionKernel, AttentionOutput, KernelCapabilities
from app.attention.kernels.eager import EagerAttention
from app.attention.registry import AttentionConfigError, register_kernel

PATTERNS = ("sliding_window", "strided", "fixed", "global_window", "random_blocks")
_BANDED = ("sliding_window", "strided", "global_window", "random_blocks")  # patterns with the local band


@dataclass(frozen=True)
class SparsePattern:
    """The settings of a sparse pattern; see the module docstring for what each one means."""

    pattern: str = "sliding_window"
    window: int = 64  # one-sided local band width
    stride: int = 32  # strided: period of the strided keys; fixed: block length
    summary: int = 1  # fixed: summary positions at the end of each stride block
    num_global: int = 0  # the first num_global positions are global
    block: int = 64  # query block size; random_blocks: the block size of the random key blocks
    num_random_blocks: int = 2  # random_blocks: random key blocks per query block
    seed: int = 0  # random_blocks: seed of the random key blocks

    def __post_init__(self) -> None:
        if self.pattern not in PATTERNS:
            raise AttentionConfigError(
                f"unknown sparse attention pattern {self.pattern!r}; valid choices: {', '.join(PATTERNS)}"
            )
        minimum = {"window": 0, "stride": 1, "summary": 1, "num_global": 0, "block": 1}
        minimum |= {"num_random_blocks": 0, "seed": 0}
        for name, low in minimum.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise AttentionConfigError(f"sparse attention {name}={value!r} must be an integer >= {low}")
        if self.summary > self.stride:
            raise AttentionConfigError(
                f"sparse attention summary={self.summary} must be at most stride={self.stride}"
            )
        if self.pattern == "global_window" and self.num_global < 1:
            raise AttentionConfigError(
                f"sparse attention pattern 'global_window' needs num_global >= 1, got {self.num_global}"
            )


# --- the pattern, element by element ------------------------------------------------------------------


def random_key_blocks(
    settings: SparsePattern, query_block: int, *, num_key_blocks: int, causal: bool
) -> list[int]:
    """The random key blocks of one query block, drawn from the blocks it may see (BigBird, section 2).

    The draw depends only on (seed, query block) and, without causal masking, on the number of key
    blocks; with causal masking it is made among blocks ``0..query_block``, which keeps it identical
    whether the keys come from full recomputation or from a (complete) decoding cache.
    """
    if query_block < 0:
        return []
    candidates = query_block + 1 if causal else num_key_blocks
    count = min(settings.num_random_blocks, candidates)
    rng = random.Random(settings.seed * 1_000_003 + query_block)
    return sorted(rng.sample(range(candidates), count))


def _random_visible(settings: SparsePattern, p: Tensor, j: Tensor, *, tk: int, causal: bool) -> Tensor:
    """Whether key ``j`` lies in one of the random blocks of the block of query ``p`` (broadcast shapes)."""
    query_blocks = torch.div(p, settings.block, rounding_mode="floor")  # (R, 1)
    width = max(settings.num_random_blocks, 1)
    chosen = torch.full((p.size(0), width), -1, dtype=torch.long, device=p.device)  # (R, r), -1 = none
    num_key_blocks = math.ceil(tk / settings.block)
    for qb in torch.unique(query_blocks).tolist():
        blocks = random_key_blocks(settings, qb, num_key_blocks=num_key_blocks, causal=causal)
        if blocks:
            rows = query_blocks[:, 0] == qb
            chosen[rows, : len(blocks)] = torch.tensor(blocks, device=p.device)
    key_blocks = torch.div(j, settings.block, rounding_mode="floor")  # (1|R, S)
    return (key_blocks[..., None] == chosen[:, None, :]).any(-1)  # (R, S)


def pattern_visible(settings: SparsePattern, p: Tensor, j: Tensor, *, tk: int, causal: bool) -> Tensor:
    """Whether query position ``p`` (R, 1) may attend key position ``j`` ((1|R), S): a (R, S) bool tensor.

    The single definition of every pattern: :func:`pattern_mask` evaluates it on the full grid and the
    kernel on the keys each block gathers. Key padding is not part of it.
    """
    s = settings
    band = (p - j).abs() <= s.window
    if s.pattern in ("sliding_window", "global_window"):
        allowed = band
    elif s.pattern == "strided":
        allowed = band | (torch.remainder(p - j, s.stride) == 0)
    elif s.pattern == "fixed":
        same_block = torch.div(p, s.stride, rounding_mode="floor") == torch.div(
            j, s.stride, rounding_mode="floor"
        )
        allowed = same_block | (torch.remainder(j, s.stride) >= s.stride - s.summary)
    else:  # random_blocks
        allowed = band | _random_visible(s, p, j, tk=tk, causal=causal)
    if s.num_global:
        allowed = allowed | ((p >= 0) & (p < s.num_global)) | (j < s.num_global)
    if causal:
        allowed = allowed & (j <= p)
    return allowed


def pattern_mask(
    settings: SparsePattern, tq: int, tk: int, *, causal: bool, device: torch.device | None = None
) -> Tensor:
    """The dense (Tq, Tk) bool mask of the pattern, True = may attend; queries are the last Tq positions.

    The kernel computes exactly softmax attention under ``pattern_mask & key padding`` without ever
    building this matrix; tests and documentation use it as the explicit form.
    """
    p = torch.arange(tq, device=device)[:, None] + (tk - tq)
    j = torch.arange(tk, device=device)[None, :]
    return pattern_visible(settings, p, j, tk=tk, causal=causal)


def pattern_covers_all(settings: SparsePattern, tq: int, tk: int) -> bool:
    """Whether every key is visible to every query of a (Tq, Tk) call (queries are the last Tq positions):
    the band reaches across all of them (``|p - j| <= max(Tq, Tk) - 1 <= window``), or for ``fixed`` all
    positions share one stride block. Causality and key padding only hide keys, so the call then equals
    dense attention under the same key and causal masks."""
    s = settings
    if s.pattern in _BANDED:
        return max(tq, tk) - 1 <= s.window
    return s.pattern == "fixed" and tq <= tk <= s.stride


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
    ) -> None:
        super().__init__()
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
        return f"{self.settings!r}, recompute={self.recompute}"

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
        return " ".join(parts)

    def scores_per_query(self, length: int, *, head_dim: int) -> int:
        """Scores of the keys a query block gathers (its band and block), kept with their gradients."""
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
