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


def symmetric_kl(logits_a: Tensor, logits_b: Tensor, target: Tensor, *, pad_id: int) -> Tensor:
    """Summed  KL(p_a || p_b) + KL(p_b || p_a)  over the non-padding positions of ``target``.

    ``logits_a``, ``logits_b`` (B, T, V) are two predictions of the same targets ``target`` (B, T), e.g.
    two passes with different dropout masks (R-Drop, Liang et al. 2021). Both directions of the KL
    together are  sum_v (p_a - p_b) * (log p_a - log p_b), one expression with no division.
    """
    dtype = torch.float64 if logits_a.dtype == torch.float64 else torch.float32
    log_a = torch.log_softmax(logits_a.to(dtype), dim=-1)  # (B, T, V)
    log_b = torch.log_softmax(logits_b.to(dtype), dim=-1)
    per_token = ((log_a.exp() - log_b.exp()) * (log_a - log_b)).sum(dim=-1)  # (B, T)
    return (per_token * target.ne(pad_id)).sum()
