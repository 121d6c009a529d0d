"""Shared-QK LSH attention rounds in chunk-major blocks (:mod:`app.attention.kernels.lsh`'s fast form).

With shared QK (Kitaev et al. 2020, section 2) every token is one item, query and key at once. A round
sorts the tokens by (bucket, position) and cuts them into chunks of ``chunk_size``; a query sees the
items of its bucket from ``chunk_size - 1`` before it to ``chunk_size`` after it (causal: up to itself),
so chunk c attends chunks c-1, c and (not causal) c+1. The chunks are the outer dimension ("chunk-major"),
so a chunk's look-around is a contiguous slice, and they go through in blocks of :data:`BLOCK_SCORES`
scores. :class:`LeanRound` is the same round keeping nothing of its blocks for the backward pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from app.attention.kernels.lsh_ops import LogSumExp, bucket_codes, lse_from_softmax

# The shared-QK form scores its sorted chunks in blocks of about this many scores (2 MiB in float32), so
# that a round's temporaries stay bounded at any length (and, with recompute, what its backward holds).
BLOCK_SCORES = 2**19


@dataclass(frozen=True)
class SharedRounds:
    """The settings a shared-QK round needs from its kernel; ``lean`` = the kernel's ``recompute``."""

    chunk_size: int
    n_hashes: int
    exclude_self: bool
    lean: bool

    def round(
        self, q: Tensor, k: Tensor, v: Tensor, kb: Tensor, r: int, *, causal: bool
    ) -> tuple[Tensor, Tensor]:
        """Round ``r`` over q, k, v (B, H, T, Dh), buckets ``kb`` (R, B, H, T): (B, H, T) log-sum-exp and
        (B, H, T, Dv) context.

        Chunk-major layout: the sorted chunks are the outer dimension, so a chunk's look-around (the
        chunks before and after it) is a contiguous slice and every product runs without copies. The
        chunks are taken a block at a time (:data:`BLOCK_SCORES` scores), so the round's temporaries stay
        bounded; with ``lean`` (the kernel's ``recompute``) the backward pass recomputes each block.
        """
        batch, heads, length, dim = q.shape
        rows, m = batch * heads, self.chunk_size
        chunks = math.ceil(length / m)
        order = (kb[r] * (length + 1) + torch.arange(length, device=q.device)).argsort(dim=-1)  # (B, H, T)
        # The sorted tokens in chunks, with one chunk before and after them (the look-around of the first
        # and last chunks): padding slots hold token T (bucket -1) in the last chunk and T + 1 (bucket -2)
        # around them, buckets that no real token has.
        fill = order.new_full((rows, m), length + 1)
        tail = order.new_full((rows, chunks * m - length), length)
        ring = torch.cat([fill, order.view(rows, length), tail, fill], dim=-1)  # (BH, (C + 2) m)
        ring = ring.view(rows, chunks + 2, m).transpose(0, 1).contiguous()  # (C + 2, BH, m)
        codes = torch.cat([kb, kb.new_full((*kb.shape[:3], 2), -1)], dim=-1)  # (R, B, H, T + 2)
        codes[..., length + 1] = -2
        codes = bucket_codes(codes).view(rows, length + 2, -1)  # (BH, T + 2, R)
        flat = [x.reshape(rows, length, dim) for x in (q, k, v)]  # (BH, T, Dh)
        blocks = cut_blocks(ring, max(1, BLOCK_SCORES // (rows * m * m * (2 if causal else 3))))
        if self.lean and torch.is_grad_enabled():  # keep nothing of the blocks for backward
            z, out = LeanRound.apply(self, *flat, codes, blocks, r, causal)
        else:
            zs, outs = zip(
                *(self.block(*flat, codes, block, r, causal=causal) for block in blocks), strict=True
            )
            z, out = torch.cat(zs), torch.cat(outs)  # (C, BH, m), (C, BH, m, Dv)
        # Back to token order: sorted slot i holds token ring[1:-1] (padding slots go to token T, dropped).
        target = ring[1 : chunks + 1].permute(1, 0, 2).reshape(rows, chunks * m)  # (BH, C m)
        z = z.permute(1, 0, 2).reshape(rows, chunks * m)  # (BH, C m)
        out = out.permute(1, 0, 2, 3).reshape(rows, chunks * m, dim)  # (BH, C m, Dv)
        z_q = z.new_full((rows, length + 1), float("-inf")).scatter(1, target, z)
        out_q = out.new_zeros(rows, length + 1, dim).scatter(1, target[..., None].expand_as(out), out)
        return z_q[:, :length].view(batch, heads, length), out_q[:, :length].view(batch, heads, length, dim)

    def block(
        self, q: Tensor, k: Tensor, v: Tensor, codes: Tensor, block: Tensor, r: int, *, causal: bool
    ) -> tuple[Tensor, Tensor]:
        """n sorted chunks of round ``r``. q, k, v (BH, T, Dh); ``codes`` (BH, T + 2, R) every round's bucket
        of every token and of the two padding tokens; ``block`` (n + 2, BH, m) the chunks' tokens with one
        chunk before and after. Returns their (n, BH, m) log-sum-exps and (n, BH, m, Dv) contexts, through
        autograd (:class:`LeanRound` is the same computation keeping nothing for backward).
        """
        (q_rows, k_ring, v_ring), _ = gather_block(block, q, k, v)
        hidden, any_kept = self.block_scores(q_rows, k_ring, codes, block, r, causal=causal)
        weights = torch.softmax(hidden, dim=-1)
        z = torch.where(any_kept, LogSumExp.apply(hidden, weights), float("-inf"))
        return z, look_around(weights, v_ring) * any_kept[..., None]  # (n, BH, m), (n, BH, m, Dv)

    def block_scores(
        self, q_rows: Tensor, k_ring: Tensor, codes: Tensor, block: Tensor, r: int, *, causal: bool
    ) -> tuple[Tensor, Tensor]:
        """Scores (n, BH, m, W) of the sorted rows ``q_rows`` (n, BH, m, Dh) against their look-around keys
        ``k_ring`` (n + 2, BH, m, Dh), less log N_ij, with the lowest finite value where hidden, and which
        rows keep any key (n, BH, m). W = 2m causal, 3m otherwise."""
        m, n = self.chunk_size, q_rows.size(0)
        sides = 2 if causal else 3
        starts = torch.arange(block.size(1), device=block.device)[None, :, None] * codes.size(1)
        ring_codes = codes.flatten(0, 1)[(block + starts).flatten()].view(
            *block.shape, -1
        )  # (n + 2, BH, m, R)
        row_codes = ring_codes[1 : n + 1]  # (n, BH, m, R)
        col_codes = torch.cat([ring_codes[s : s + n] for s in range(sides)], dim=-2)  # (n, BH, W, R)
        scores = torch.cat([q_rows @ k_ring[s : s + n].transpose(-1, -2) for s in range(sides)], dim=-1)
        keep, repeats = None, None  # scores, keep, repeats: (n, BH, m, W)
        for s in range(self.n_hashes):
            same = row_codes[..., :, None, s] == col_codes[..., None, :, s]
            if s == r:
                keep = same & self.band(m, causal, q_rows.device)
            repeats = same.to(torch.uint8) if repeats is None else repeats.add_(same)
        if self.n_hashes > 1:  # N_ij: rounds in which key j shares query i's bucket (>= 1 where kept)
            scores.sub_(repeats.to(scores.dtype).clamp_(min=1).log_())
        return scores.masked_fill_(~keep, torch.finfo(scores.dtype).min), keep.any(dim=-1)

    def band(self, m: int, causal: bool, device: torch.device) -> Tensor:
        """(m, W) which look-around columns row o of a chunk may see: sorted offsets -(m - 1) .. m (causal:
        .. 0) from the row, without the row itself when ``exclude_self``. Column w is the item w - m after
        the chunk's first."""
        offset = (
            torch.arange((2 if causal else 3) * m, device=device)[None, :]
            - m
            - torch.arange(m, device=device)[:, None]
        )
        band = (offset > -m) & (offset <= (0 if causal else m))
        return band & (offset != 0) if self.exclude_self else band


def gather_block(block: Tensor, q: Tensor, *look_around: Tensor) -> tuple[tuple[Tensor, ...], Tensor]:
    """The block's sorted query rows and look-around rows of each tensor in ``look_around``.

    ``block`` (n + 2, BH, m) holds token indices (padding slots: T or more, read as token T - 1 and masked
    by their bucket); q and the others are (BH, T, D). Returns (q rows (n, BH, m, D), then one
    (n + 2, BH, m, D) per tensor) and the flat row index ((n + 2) BH m,) they were read at.
    """
    rings, heads, m = block.shape
    length = q.size(1)
    rows = (
        block.clamp(max=length - 1) + torch.arange(heads, device=q.device)[None, :, None] * length
    ).flatten()
    inner = rows[heads * m : -heads * m]  # the n chunks themselves
    picked = [q.flatten(0, 1).index_select(0, inner).view(rings - 2, heads, m, -1)]
    picked += [x.flatten(0, 1).index_select(0, rows).view(rings, heads, m, -1) for x in look_around]
    return tuple(picked), rows


def look_around(weights: Tensor, ring: Tensor) -> Tensor:
    """``weights`` (n, BH, m, W) times each row's look-around rows of ``ring`` (n + 2, BH, m, D), giving
    (n, BH, m, D): column block s of chunk c's weights belongs to chunk c + s - 1, a slice of the ring."""
    m, n = ring.size(2), weights.size(0)
    return sum(weights[..., s * m : (s + 1) * m] @ ring[s : s + n] for s in range(weights.size(-1) // m))


def kept_softmax(hidden: Tensor, any_kept: Tensor) -> Tensor:
    """Softmax weights (..., W) of the masked scores ``hidden``; 0 in the rows that keep nothing."""
    return torch.softmax(hidden, dim=-1).mul_(any_kept[..., None])


def cut_blocks(ring: Tensor, step: int) -> list[Tensor]:
    """``ring`` (C + 2, BH, m) cut into blocks of ``step`` chunks, each with its chunk before and after."""
    chunks = ring.size(0) - 2
    return [ring[first : min(first + step, chunks) + 2] for first in range(0, chunks, step)]


class LeanRound(torch.autograd.Function):
    """One round of shared-QK LSH attention, block by block, keeping nothing of its blocks for backward.

    The backward pass gathers each block's rows again and recomputes its scores and weights P; then
    dS = P * (dP - rowsum(P * dP) + dz) with dP = dO V^T, as in FlashAttention's backward (Dao et al.
    2022), and the rows' gradients are added to their tokens' (one buffer per input).
    """

    @staticmethod
    def forward(
        ctx: Any,
        rounds: SharedRounds,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        codes: Tensor,
        blocks: list[Tensor],
        r: int,
        causal: bool,
    ) -> tuple[Tensor, Tensor]:
        zs, outs = [], []
        for block in blocks:
            (q_rows, k_ring, v_ring), _ = gather_block(block, q, k, v)
            hidden, any_kept = rounds.block_scores(q_rows, k_ring, codes, block, r, causal=causal)
            weights = kept_softmax(hidden, any_kept)
            zs.append(torch.where(any_kept, lse_from_softmax(hidden, weights), float("-inf")))
            outs.append(look_around(weights, v_ring))
        z = torch.cat(zs)  # (C, BH, m)
        ctx.save_for_backward(q, k, v, codes)
        ctx.rounds, ctx.blocks, ctx.round, ctx.causal = rounds, blocks, r, causal
        return z, torch.cat(outs)

    @staticmethod
    def backward(ctx: Any, dz: Tensor, dout: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, codes = ctx.saved_tensors
        grads = [torch.zeros_like(x).flatten(0, 1) for x in (q, k, v)]  # (BH T, D) each
        first = 0
        for block in ctx.blocks:
            n = block.size(0) - 2
            rows = slice(first, first + n)
            first += n
            (q_rows, k_ring, v_ring), index = gather_block(block, q, k, v)
            hidden, any_kept = ctx.rounds.block_scores(
                q_rows, k_ring, codes, block, ctx.round, causal=ctx.causal
            )
            weights = kept_softmax(hidden, any_kept)  # (n, BH, m, W), as the forward pass computed them
            d_weights = torch.cat(
                [
                    dout[rows] @ v_ring[s : s + n].transpose(-1, -2)
                    for s in range(weights.size(-1) // block.size(2))
                ],
                dim=-1,
            )
            d_scores = weights * (
                d_weights - (weights * d_weights).sum(-1, keepdim=True) + dz[rows, ..., None]
            )
            del d_weights
            inner = index[block[0].numel() : -block[0].numel()]
            grads[0].index_add_(0, inner, look_around(d_scores, k_ring).flatten(0, 2))
            grads[1].index_add_(0, index, look_back(d_scores, q_rows).flatten(0, 2))
            grads[2].index_add_(0, index, look_back(weights, dout[rows]).flatten(0, 2))
        return None, *(g.view_as(x) for g, x in zip(grads, (q, k, v), strict=True)), None, None, None, None


def look_back(weights: Tensor, rows: Tensor) -> Tensor:
    """The transpose of :func:`look_around`: what ``rows`` (n, BH, m, D), weighted by ``weights``
    (n, BH, m, W), add to each look-around row of the ring: (n + 2, BH, m, D)."""
    n, heads, m, dim = rows.shape
    ring = rows.new_zeros(n + 2, heads, m, dim)
    for s in range(weights.size(-1) // m):
        ring[s : s + n] += weights[..., s * m : (s + 1) * m].transpose(-1, -2) @ rows
    return ring
