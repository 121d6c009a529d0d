"""Padding and causal masks. Convention: bool tensors, True = may attend (a real, visible key); the fused
kernels get a float additive form (:func:`additive_mask`) of the smallest shape that is correct."""

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


def rows_seeing_keys(
    key_mask: Tensor | None, *, causal: bool, tq: int, tk: int, device: torch.device | None = None
) -> Tensor | None:
    """(B|1, 1, Tq|1, 1) bool, False for query rows that may attend no key (their output is zero); None
    where no such row can exist (no key mask, and no causal query before the first key).

    Read from the (B, Tk) key mask alone, never from a (B, 1, Tq, Tk) mask: without ``causal`` a row is
    empty only when its sequence has no real key; with it, query i (at position i + Tk - Tq) is empty when
    its sequence's first real key comes later.
    """
    offset = tk - tq
    if key_mask is None:
        if not causal or offset >= 0:
            return None
        return (torch.arange(tq, device=device) + offset >= 0)[
            None, None, :, None
        ]  # (1, 1, Tq, 1); Tq > Tk here
    has_any = key_mask.any(dim=-1)  # (B,)
    if not causal:
        return has_any[:, None, None, None]  # (B, 1, 1, 1)
    first = torch.where(has_any, key_mask.int().argmax(dim=-1), tk)  # (B,) index of the first real key
    positions = torch.arange(tq, device=device) + offset  # (Tq,)
    return (positions[None, :] >= first[:, None])[:, None, :, None]  # (B, 1, Tq, 1)


def additive_mask(
    key_mask: Tensor | None,
    *,
    causal: bool,
    tq: int,
    tk: int,
    dtype: torch.dtype,
    device: torch.device | None = None,
    has_keys: Tensor | None = None,
) -> Tensor | None:
    """A float mask to add to the scores (0 = may attend, -inf = hidden) for fused kernels, or None.

    Its shape is the smallest that is correct: key padding alone is a broadcast (B, 1, 1, Tk), causal
    alone (1, 1, Tq, Tk), both (B, 1, Tq, Tk). Float, because a boolean mask is converted to this by SDPA on
    every call anyway. ``has_keys`` (:func:`rows_seeing_keys`) names the rows with no visible key: they see
    every key instead, so that no backend meets an all -inf row (some give NaN there, also in the backward
    pass); the caller replaces their output by zeros.
    """
    visible = None if key_mask is None else key_mask[:, None, None, :]  # (B, 1, 1, Tk)
    if causal:
        tri = causal_mask(tq, tk, device)[None, None]  # (1, 1, Tq, Tk)
        visible = tri if visible is None else visible & tri
    if visible is None:
        return None
    if has_keys is not None:
        visible = visible | ~has_keys
    hidden = torch.zeros(visible.shape, dtype=dtype, device=device)
    return hidden.masked_fill_(~visible, float("-inf"))
