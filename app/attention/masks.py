"""Padding and causal masks. Convention: bool tensors, True = may attend (a real, visible key)."""

from __future__ import annotations

import torch
from torch import Tensor


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """(B, T) True where ``tokens`` is a real token, False at padding."""
    return tokens != pad_id


def causal_mask(tq: int, tk: int, device: torch.device | None = None) -> Tensor:
    """(Tq, Tk) True where query i may see key j, queries aligned to the end of the keys.

    Query i sits at absolute position i + (Tk - Tq); it sees every key up to and including itself.
    """
    offset = tk - tq
    rows = torch.arange(tq, device=device)[:, None] + offset
    cols = torch.arange(tk, device=device)[None, :]
    return cols <= rows


def attention_mask(
    key_mask: Tensor | None, *, causal: bool, tq: int, tk: int, device: torch.device | None = None
) -> Tensor | None:
    """Combine a (B, Tk) key mask and a causal constraint into a (B|1, 1, Tq, Tk) mask, or None."""
    mask = None
    if key_mask is not None:
        mask = key_mask[:, None, None, :]  # (B, 1, 1, Tk)
    if causal:
        tri = causal_mask(tq, tk, device)[None, None]  # (1, 1, Tq, Tk)
        mask = tri if mask is None else mask & tri
    return mask
