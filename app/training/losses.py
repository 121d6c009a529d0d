"""Label-smoothed cross-entropy (Szegedy et al. 2016; Vaswani et al. 2017, section 5.4).

The loss over a (tokens x vocabulary) logit matrix dominates the memory traffic of a small
translation model, so it is one fused autograd function: one log-sum-exp in the forward pass and
one softmax in the backward pass, instead of separate full-size tensors for log-probabilities, the
NLL term, the smoothing term and their gradients.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _smoothed_rows(
    log_probs: Tensor, target: Tensor, keep: Tensor, epsilon: float, need_grad: bool
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Per row of a block: -log p[y], mean_v -log p[v], and (if asked) d loss / d logits.

    ``log_probs`` (R, V) float, ``target`` and ``keep`` (R,). The gradient of a real row is
    softmax - ((1 - eps) * onehot(y) + eps / V), and 0 for padding; it is built in ``log_probs``'s buffer.
    """
    nll = log_probs.gather(1, target[:, None]).squeeze(1).neg_()  # (R,)
    smooth = log_probs.mean(dim=-1).neg_()  # (R,)
    if not need_grad:
        return nll, smooth, None
    grad = log_probs.exp_().sub_(epsilon / log_probs.size(-1))  # softmax - eps / V
    grad.scatter_add_(1, target[:, None], grad.new_full((grad.size(0), 1), epsilon - 1.0))
    return nll, smooth, grad.mul_(keep[:, None])


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Summed loss  sum_t [(1 - eps) * (-log p_t[y_t]) + eps * mean_v(-log p_t[v])]  over real targets.

    Value and gradient are computed together in the forward pass, a few rows at a time, so the
    float32 temporaries of a block stay in cache and the (rows x vocabulary) work reads the logits and
    writes the gradient once each; the gradient is kept in the logits' dtype. Backward only scales it
    (in place, so the graph can be run backward once only). Without a gradient to compute (validation),
    the forward pass computes the value alone.
    """

    CACHE_FLOATS = 1 << 20  # float32 elements per temporary block (4 MiB)

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float, pad_id: int) -> tuple[Tensor, Tensor]:
        dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        rows, vocab = logits.shape
        # Logits in the compute dtype have no cast to save: one block, the gradient built in place.
        in_place = logits.dtype == dtype
        block = rows if in_place else max(1, _SmoothedCrossEntropy.CACHE_FLOATS // vocab)
        keep = target != pad_id  # (N,)
        nll = logits.new_empty(rows, dtype=dtype)  # (N,) -log p[y], then masked
        smooth = logits.new_empty(rows, dtype=dtype)  # (N,) mean_v -log p[v], then masked
        need_grad = ctx.needs_input_grad[0]
        grad = torch.empty_like(logits) if need_grad and not in_place else None  # (N, V)
        for start in range(0, rows, block):
            part = slice(start, start + block)
            log_probs = torch.log_softmax(logits[part].to(dtype), dim=-1)  # (block, V)
            nll[part], smooth[part], block_grad = _smoothed_rows(
                log_probs, target[part], keep[part], epsilon, need_grad
            )
            if block_grad is not None and in_place:
                grad = block_grad
            elif block_grad is not None:
                grad[part] = block_grad
        nll_sum = (nll * keep).sum()
        ctx.mark_non_differentiable(nll_sum)
        ctx.save_for_backward(grad)
        return (1.0 - epsilon) * nll_sum + epsilon * (smooth * keep).sum(), nll_sum

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Tensor | None, ...]:
        (grad,) = ctx.saved_tensors
        return grad.mul_(grad_loss.to(grad.dtype)), None, None, None


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


class _LinearSmoothedCrossEntropy(torch.autograd.Function):
    """The output layer and :class:`_SmoothedCrossEntropy` in one pass over blocks of rows.

    ``logits = hidden @ weight.T + bias`` is never held for all rows: each block's logits, their loss,
    their gradient and its products with the layer's weights (the gradients of ``hidden``, ``weight``
    and ``bias``) are computed while the block is in cache. A (tokens x vocabulary) matrix is the
    largest tensor of a small model's step; on a CPU a fresh one of that size is mapped and
    page-faulted on every step, which cost about as much as the matrix product that fills it
    (docs/throughput.md).
    Under autocast the matrix products run in the autocast dtype, like ``nn.Linear``; the softmax in
    float32. Backward only scales the gradients computed here, so the graph runs backward once only.
    """

    CACHE_FLOATS = 1 << 21  # float32 elements of a block's (rows x vocabulary) temporaries (8 MiB)

    @staticmethod
    def forward(
        ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor, epsilon: float, pad_id: int
    ) -> tuple[Tensor, Tensor]:
        dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
        device = hidden.device.type
        mm_dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        rows = hidden.size(0)
        block = max(1, _LinearSmoothedCrossEntropy.CACHE_FLOATS // weight.size(0))
        w = weight.to(mm_dtype)  # (V, D)
        b = None if bias is None else bias.to(mm_dtype)  # (V,)
        keep = target != pad_id  # (N,)
        nll = hidden.new_empty(rows, dtype=dtype)  # (N,) -log p[y], then masked
        smooth = hidden.new_empty(rows, dtype=dtype)  # (N,) mean_v -log p[v], then masked
        need_grad = any(ctx.needs_input_grad[:3])
        if need_grad:
            grad_hidden = torch.empty_like(hidden)  # (N, D)
            grad_weight = torch.zeros_like(weight, dtype=dtype)  # (V, D), summed over blocks
            grad_bias = None if bias is None else torch.zeros_like(bias, dtype=dtype)  # (V,)
        for start in range(0, rows, block):
            part = slice(start, start + block)
            h = hidden[part].to(mm_dtype)  # (block, D)
            log_probs = torch.log_softmax(F.linear(h, w, b), dim=-1, dtype=dtype)  # (block, V)
            nll[part], smooth[part], block_grad = _smoothed_rows(
                log_probs, target[part], keep[part], epsilon, need_grad
            )
            if block_grad is None:
                continue
            grad_logits = block_grad.to(mm_dtype)  # (block, V)
            grad_hidden[part] = grad_logits @ w
            grad_weight += grad_logits.t() @ h
            if grad_bias is not None:
                grad_bias += block_grad.sum(dim=0)
        nll_sum = (nll * keep).sum()
        ctx.mark_non_differentiable(nll_sum)
        if need_grad:
            ctx.grads = (
                grad_hidden,
                grad_weight.to(weight.dtype),
                None if bias is None else grad_bias.to(bias.dtype),
            )
        return (1.0 - epsilon) * nll_sum + epsilon * (smooth * keep).sum(), nll_sum

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Tensor | None, ...]:
        grads = [None if g is None else g.mul_(grad_loss.to(g.dtype)) for g in ctx.grads]
        del ctx.grads
        return *grads, None, None, None


def linear_smoothed_nll(
    hidden: Tensor, output: nn.Linear, target: Tensor, *, epsilon: float, pad_id: int
) -> tuple[Tensor, Tensor]:
    """:func:`label_smoothed_nll` of ``output(hidden)``, without holding the logits of every row.

    ``hidden`` (B, T, D) the states the output layer reads, ``target`` (B, T). The same values and
    gradients as ``label_smoothed_nll(output(hidden), ...)``, up to rounding.
    """
    flat_hidden = hidden.reshape(-1, hidden.size(-1))
    return _LinearSmoothedCrossEntropy.apply(
        flat_hidden, output.weight, output.bias, target.reshape(-1), float(epsilon), int(pad_id)
    )


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
