"""Label-smoothed cross-entropy (Szegedy et al. 2016; Vaswani et al. 2017, section 5.4).

The loss over a (tokens x vocabulary) logit matrix dominates the memory traffic of a small
translation model, so it is one fused autograd function: one log-sum-exp in the forward pass and
one softmax in the backward pass, instead of separate full-size tensors for log-probabilities, the
NLL term, the smoothing term and their gradients.
"""

from __future__ import annotations

import torch
from torch import Tensor


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Summed loss  sum_t [(1 - eps) * (-log p_t[y_t]) + eps * mean_v(-log p_t[v])]  over real targets.

    The gradient w.r.t. the logits of a real target row is  softmax - ((1 - eps) * onehot(y) + eps / V);
    it is computed in place in the saved log-probabilities, so the graph can be run backward once only.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float, pad_id: int) -> tuple[Tensor, Tensor]:
        dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        log_probs = torch.log_softmax(logits.to(dtype), dim=-1)  # (N, V)
        keep = target != pad_id  # (N,)
        nll = -log_probs.gather(1, target[:, None]).squeeze(1) * keep
        smooth = -log_probs.mean(dim=-1) * keep
        ctx.save_for_backward(log_probs, target, keep)
        ctx.epsilon = epsilon
        nll_sum = nll.sum()
        ctx.mark_non_differentiable(nll_sum)
        return (1.0 - epsilon) * nll_sum + epsilon * smooth.sum(), nll_sum

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Tensor | None, ...]:
        log_probs, target, keep = ctx.saved_tensors
        eps, vocab = ctx.epsilon, log_probs.size(-1)
        grad = log_probs.exp_()  # softmax, reusing the saved buffer
        grad.sub_(eps / vocab)
        grad.scatter_add_(1, target[:, None], grad.new_full((grad.size(0), 1), eps - 1.0))
        grad.mul_((keep.to(grad.dtype) * grad_loss)[:, None])
        return grad, None, None, None


def label_smoothed_nll(
    logits: Tensor, target: Tensor, *, epsilon: float, pad_id: int
) -> tuple[Tensor, Tensor]:
    """Summed smoothed loss and summed plain NLL over non-padding targets.

    ``logits`` (B, T, V), ``target`` (B, T). The smoothed target puts 1 - epsilon on the reference
    token and spreads epsilon uniformly over the whole vocabulary. Sums, not means, so callers can
    normalise by the token count of the whole (possibly distributed) batch.
    """
    flat_logits = logits.reshape(-1, logits.size(-1))
    loss, nll = _SmoothedCrossEntropy.apply(flat_logits, target.reshape(-1), float(epsilon), int(pad_id))
    return loss, nll


class _SymmetricKL(torch.autograd.Function):
    """Summed  KL(p || q) + KL(q || p)  over kept rows, p = softmax(a), q = softmax(b).

    Both directions together are  sum_v (p - q)(log p - log q), and their gradients are
        d/da = p * (log p - log q - KL(p || q) + 1) - q,   d/db = q * (log q - log p - KL(q || p) + 1) - p.
    The forward pass computes value and gradients together, a few rows at a time so that the float32
    temporaries of a block stay in cache: the (rows x vocabulary) work then reads the logits and writes
    the gradients once each, which matters when the vocabulary is most of a small model's arithmetic.
    The gradients are kept in the logits' dtype and scaled in place, so backward runs once only.
    """

    CACHE_FLOATS = 1 << 18  # float32 elements per temporary block (1 MiB)

    @staticmethod
    def forward(ctx, logits_a: Tensor, logits_b: Tensor, keep: Tensor) -> Tensor:
        dtype = torch.float64 if logits_a.dtype == torch.float64 else torch.float32
        rows, vocab = logits_a.shape
        block = max(1, _SymmetricKL.CACHE_FLOATS // vocab)
        grad_a, grad_b = torch.empty_like(logits_a), torch.empty_like(logits_b)  # (N, V)
        per_row = logits_a.new_zeros(rows, dtype=dtype)  # (N,)
        for start in range(0, rows, block):
            part = slice(start, start + block)
            log_ratio = torch.log_softmax(logits_a[part].to(dtype), dim=-1)  # log p, then log p - log q
            log_q = torch.log_softmax(logits_b[part].to(dtype), dim=-1)
            p, q = log_ratio.exp(), log_q.exp()
            log_ratio.sub_(log_q)
            kl_pq = (p * log_ratio).sum(dim=-1, keepdim=True)  # (block, 1)
            kl_qp = -(q * log_ratio).sum(dim=-1, keepdim=True)
            weight = keep[part, None].to(dtype)
            per_row[part] = ((kl_pq + kl_qp) * weight).squeeze(1)
            grad_b[part] = log_q.copy_(q).mul_(1.0 - kl_qp - log_ratio).sub_(p).mul_(weight)
            grad_a[part] = log_ratio.sub_(kl_pq).add_(1.0).mul_(p).sub_(q).mul_(weight)
        ctx.save_for_backward(grad_a, grad_b)
        return per_row.sum()

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        grad_a, grad_b = ctx.saved_tensors
        scale = grad_out.to(grad_a.dtype)
        return grad_a.mul_(scale), grad_b.mul_(scale), None


def symmetric_kl(logits_a: Tensor, logits_b: Tensor, target: Tensor, *, pad_id: int) -> Tensor:
    """Summed  KL(p_a || p_b) + KL(p_b || p_a)  over the non-padding positions of ``target``.

    ``logits_a``, ``logits_b`` (B, T, V) are two predictions of the same targets ``target`` (B, T), e.g.
    two passes with different dropout masks (R-Drop, Liang et al. 2021).
    """
    vocab = logits_a.size(-1)
    keep = target.reshape(-1).ne(pad_id)  # (B*T,)
    return _SymmetricKL.apply(logits_a.reshape(-1, vocab), logits_b.reshape(-1, vocab), keep)
