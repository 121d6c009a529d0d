"""Label-smoothed cross-entropy (Szegedy et al. 2016; Vaswani et al. 2017, section 5.4)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def label_smoothed_nll(
    logits: Tensor, target: Tensor, *, epsilon: float, pad_id: int
) -> tuple[Tensor, Tensor]:
    """Summed smoothed loss and summed plain NLL over non-padding targets.

    ``logits`` (B, T, V), ``target`` (B, T). The smoothed target puts 1 - epsilon on the reference
    token and spreads epsilon uniformly over the whole vocabulary. Sums, not means, so callers can
    normalise by the token count of the whole (possibly distributed) batch.
    """
    flat_logits = logits.reshape(-1, logits.size(-1)).float()
    flat_target = target.reshape(-1)
    loss = F.cross_entropy(
        flat_logits, flat_target, ignore_index=pad_id, label_smoothing=epsilon, reduction="sum"
    )
    nll = F.cross_entropy(flat_logits.detach(), flat_target, ignore_index=pad_id, reduction="sum")
    return loss, nll
