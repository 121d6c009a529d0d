"""Token embeddings and sinusoidal positions (Vaswani et al. 2017, section 3.4 and 3.5)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class TokenEmbedding(nn.Embedding):
    """Embedding lookup scaled by sqrt(d_model), as in section 3.4 (``scale=False``: unscaled)."""

    def __init__(self, *, vocab_size: int, d_model: int, pad_id: int, scale: bool = True) -> None:
        super().__init__(vocab_size, d_model, padding_idx=pad_id)
        nn.init.normal_(self.weight, mean=0.0, std=d_model**-0.5)
        with torch.no_grad():
            self.weight[pad_id].zero_()
        self.scale = math.sqrt(d_model) if scale else 1.0

    def forward(self, tokens: Tensor) -> Tensor:
        return super().forward(tokens) * self.scale


POSITION_LAYOUTS = ("interleaved", "halves")


def sinusoid_table(length: int, d_model: int, layout: str = "interleaved") -> Tensor:
    """(length, d_model) sinusoids of frequencies w_i = 10000^(-2i/d), i < d/2.

    ``interleaved`` (the paper's eq.): PE(pos, 2i) = sin(pos w_i), PE(pos, 2i+1) = cos(pos w_i).
    ``halves`` (Marian, tensor2tensor, fairseq): all sines first, then all cosines: PE(pos, i) = sin(pos w_i),
    PE(pos, d/2 + i) = cos(pos w_i). The same features in another order, so a model trained with one
    layout needs that one.
    """
    if layout not in POSITION_LAYOUTS:
        raise ValueError(f"unknown positions layout {layout!r}; valid choices: {', '.join(POSITION_LAYOUTS)}")
    positions = torch.arange(length, dtype=torch.float64)[:, None]
    freqs = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
    sines, cosines = torch.sin(positions * freqs), torch.cos(positions * freqs[: d_model // 2])
    table = torch.zeros(length, d_model, dtype=torch.float64)
    if layout == "interleaved":
        table[:, 0::2], table[:, 1::2] = sines, cosines
    else:
        half = sines.size(1)  # (d + 1) // 2: an odd width has one more sine
        table[:, :half], table[:, half:] = sines, cosines
    return table.float()


class SinusoidalPositions(nn.Module):
    """Adds fixed sinusoidal position encodings, starting at an offset for incremental decoding."""

    def __init__(self, *, d_model: int, max_len: int, layout: str = "interleaved") -> None:
        super().__init__()
        self.max_len = max_len
        self.register_buffer("table", sinusoid_table(max_len, d_model, layout), persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """``x`` (B, T, D) gets the encodings of positions offset .. offset + T - 1."""
        end = offset + x.size(1)
        if end > self.max_len:
            raise ValueError(f"sequence of {end} positions exceeds max_positions={self.max_len}")
        return x + self.table[offset:end].to(x.dtype)

    def at(self, x: Tensor, positions: Tensor, longest: int) -> Tensor:
        """``x`` (N, D), packed tokens, gets the encodings of their own ``positions`` (N,) (a packed batch's,
        restarting at 0 in every sequence); ``longest`` (the longest sequence, known on the host) is checked
        against ``max_positions`` without reading the positions back from the device."""
        if longest > self.max_len:
            raise ValueError(f"sequence of {longest} positions exceeds max_positions={self.max_len}")
        return x + self.table.index_select(0, positions).to(x.dtype)
