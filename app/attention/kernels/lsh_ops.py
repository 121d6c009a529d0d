"""Tensor pieces of LSH attention (:mod:`app.attention.kernels.lsh`): the softmax its rounds combine with,
bucket codes, gathers.

Each round is a softmax over the keys the round lets a query see; rounds are combined by their
log-sum-exps, so every round returns that too, with gradients, and rows that see nothing stay finite.
"""

from __future__ import annotations

import torch
from torch import Tensor


def masked_softmax_lse(scores: Tensor, keep: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Softmax of ``scores`` (..., n) over the ``keep`` entries: its log-sum-exp (...) and ``weights @ v``.

    A row with nothing kept gives log-sum-exp -inf and context 0, with finite (zero) gradients.
    """
    # Hidden entries get the lowest finite score (exp gives exactly 0 beside any kept one); a row with
    # nothing kept is then uniform over garbage, so its context is zeroed and its log-sum-exp set to -inf.
    hidden = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
    any_kept = keep.any(dim=-1)  # (...)
    weights = torch.softmax(hidden, dim=-1)
    z = torch.where(any_kept, LogSumExp.apply(hidden, weights), float("-inf"))
    return z, (weights @ v) * any_kept[..., None]


def lse_from_softmax(scores: Tensor, weights: Tensor) -> Tensor:
    """log-sum-exp (...) of ``scores`` (..., n) from their softmax ``weights``: s_j - log w_j at the top j."""
    top, where = weights.max(dim=-1, keepdim=True)
    return (scores.gather(-1, where) - top.log()).squeeze(-1)


class LogSumExp(torch.autograd.Function):
    """log-sum-exp of ``scores`` (..., n) given their softmax ``weights``: z = s_j - log w_j at the top
    entry j, and dz/ds = w. The backward pass keeps only the weights (the softmax keeps them anyway)."""

    @staticmethod
    def forward(ctx, scores: Tensor, weights: Tensor) -> Tensor:
        ctx.save_for_backward(weights)
        return lse_from_softmax(scores, weights)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        (weights,) = ctx.saved_tensors
        return grad[..., None] * weights, None


def safe_softmax(z: Tensor, *, dim: int) -> Tensor:
    """softmax(z) along ``dim`` where some entry is finite, 0 where all are -inf (finite gradients)."""
    top = z.amax(dim=dim, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top)).detach()
    exp = torch.exp(z - top)
    total = exp.sum(dim, keepdim=True)
    return exp / total.clamp(min=torch.finfo(total.dtype).tiny)


def bucket_codes(buckets: Tensor) -> Tensor:
    """(R, B, H, T) buckets as (B, H, T, R) int16 (padding's bucket n_buckets included): less to compare."""
    return buckets.permute(1, 2, 3, 0).to(torch.int16)


def take(x: Tensor, index: Tensor) -> Tensor:
    """``x`` (B, H, T[, D]) at positions ``index`` (B, H, C, n): (B, H, C, n[, D])."""
    flat = index.flatten(2)  # (B, H, C * n)
    if x.dim() == 3:
        return x.gather(2, flat).view(index.shape)
    picked = x.gather(2, flat[..., None].expand(-1, -1, -1, x.size(-1)))
    return picked.view(*index.shape, x.size(-1))
