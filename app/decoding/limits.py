"""How long an output may grow: per sentence, so a sentence decodes the same alone and in a batch."""

from __future__ import annotations

import torch
from torch import Tensor


def output_limits(src: Tensor, pad_id: int, *, max_len: int, ratio: float = 1.5, extra: int = 10) -> Tensor:
    """(B,) maximum number of output tokens (EOS included): min(max_len, ratio * src_len + extra)."""
    src_len = (src != pad_id).sum(dim=1)
    limit = (src_len.double() * ratio).long() + extra
    return torch.clamp(limit, min=1, max=max_len)
