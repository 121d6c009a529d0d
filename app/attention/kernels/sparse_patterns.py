"""The sparse attention patterns: which key positions a query position may attend, and nothing else.

The single definition of every pattern (:func:`pattern_visible`), shared by the sparse kernel's two ways of
computing it (app/attention/kernels/sparse.py): the blockwise loop, which gathers the keys each query block
may reach, and FlexAttention's block-sparse masks (``backend=flex``), whose ``mask_mod`` evaluates the same
function one (query, key) pair at a time. It is written with element-wise tensor operations and table
look-ups only, so that both a (R, S) grid and FlexAttention's vectorised scalar calls evaluate it.

Patterns (``pattern`` option), for a query at position ``p`` and a key at position ``j``:

* ``sliding_window``: ``|p - j| <= window`` (Beltagy et al. 2020, "Longformer", section 3.1; our
  ``window`` is one-sided, so a query sees ``2 * window + 1`` keys, or ``window + 1`` when causal).
* ``strided``: the local band above, or ``(p - j) % stride == 0`` (Child et al. 2019, "Generating Long
  Sequences with Sparse Transformers", section 4.2, the union of its two strided heads).
* ``fixed``: keys in the same ``stride``-long block as the query (``p // stride == j // stride``), or one
  of the last ``summary`` positions of any block (Child et al. 2019, section 4.2, "fixed" pattern, c =
  ``summary``).
* ``global_window``: ``sliding_window`` plus ``num_global >= 1`` global tokens (Longformer, section 3.1).
* ``random_blocks``: the local band, plus ``num_random_blocks`` key blocks of ``block`` positions drawn
  for each query block (Zaheer et al. 2020, "Big Bird", section 2); combine with ``num_global`` for the
  full BigBird pattern.

``num_global`` > 0 adds global tokens to any pattern: the first ``num_global`` positions attend to every
key and every query attends to them. ``causal`` and key padding are applied on top of every pattern.

Positions follow :mod:`app.attention.base`: key ``j`` sits at position ``j`` and query ``i`` at
``p = i + (Tk - Tq)``, so cached incremental decoding (Tq = 1) sees the pattern of full recomputation.
With Tq > Tk the first queries get negative positions: they come before every key and are never global.
A cache truncated to the last ``cache_window()`` keys shifts query and key positions alike, which only
the sliding window (a function of ``p - j``) survives; every other pattern needs the whole cache.

The patterns relate positions *within one sequence*: cross-attention, where a target position and a
source position are not comparable, needs a dense kernel (``capabilities.across_sequences`` is False).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from app.attention.registry import AttentionConfigError

PATTERNS = ("sliding_window", "strided", "fixed", "global_window", "random_blocks")
_BANDED = ("sliding_window", "strided", "global_window", "random_blocks")  # patterns with the local band


@dataclass(frozen=True)
class SparsePattern:
    """The settings of a sparse pattern; see the module docstring for what each one means."""

    pattern: str = "sliding_window"
    window: int = 64  # one-sided local band width
    stride: int = 32  # strided: period of the strided keys; fixed: block length
    summary: int = 1  # fixed: summary positions at the end of each stride block
    num_global: int = 0  # the first num_global positions are global
    block: int = 64  # query block size; random_blocks: the block size of the random key blocks
    num_random_blocks: int = 2  # random_blocks: random key blocks per query block
    seed: int = 0  # random_blocks: seed of the random key blocks

    def __post_init__(self) -> None:
        if self.pattern not in PATTERNS:
            raise AttentionConfigError(
                f"unknown sparse attention pattern {self.pattern!r}; valid choices: {', '.join(PATTERNS)}"
            )
        minimum = {"window": 0, "stride": 1, "summary": 1, "num_global": 0, "block": 1}
        minimum |= {"num_random_blocks": 0, "seed": 0}
        for name, low in minimum.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise AttentionConfigError(f"sparse attention {name}={value!r} must be an integer >= {low}")
        if self.summary > self.stride:
            raise AttentionConfigError(
                f"sparse attention summary={self.summary} must be at most stride={self.stride}"
            )
        if self.pattern == "global_window" and self.num_global < 1:
            raise AttentionConfigError(
                f"sparse attention pattern 'global_window' needs num_global >= 1, got {self.num_global}"
            )


# --- the pattern, element by element ------------------------------------------------------------------


def random_key_blocks(
    settings: SparsePattern, query_block: int, *, num_key_blocks: int, causal: bool
) -> list[int]:
    """The random key blocks of one query block, drawn from the blocks it may see (BigBird, section 2).

    The draw depends only on (seed, query block) and, without causal masking, on the number of key
    blocks; with causal masking it is made among blocks ``0..query_block``, which keeps it identical
    whether the keys come from full recomputation or from a (complete) decoding cache.
    """
    if query_block < 0:
        return []
    candidates = query_block + 1 if causal else num_key_blocks
    count = min(settings.num_random_blocks, candidates)
    rng = random.Random(settings.seed * 1_000_003 + query_block)
    return sorted(rng.sample(range(candidates), count))


@lru_cache(maxsize=32)
def random_block_table(settings: SparsePattern, num_key_blocks: int, causal: bool) -> Tensor:
    """(QB, KB) bool, QB = KB = ``num_key_blocks``: whether query block qb drew key block kb (on the CPU;
    cached, so a long sequence draws its blocks once, not once per query block). Query positions never
    exceed the last key's, so ``num_key_blocks`` query blocks cover every query."""
    table = torch.zeros(num_key_blocks, num_key_blocks, dtype=torch.bool)
    for qb in range(num_key_blocks):
        blocks = random_key_blocks(settings, qb, num_key_blocks=num_key_blocks, causal=causal)
        table[qb, blocks] = True
    return table


def pattern_table(settings: SparsePattern, *, tk: int, causal: bool, device: torch.device) -> Tensor | None:
    """What :func:`pattern_visible` looks up besides positions, for ``tk`` keys on ``device``: the random
    blocks' :func:`random_block_table`, None for the other patterns. Drawn outside the function, so that a
    compiled or traced caller (FlexAttention's ``mask_mod``) sees only tensor operations."""
    if settings.pattern != "random_blocks":
        return None
    return random_block_table(settings, math.ceil(tk / settings.block), causal).to(device)


def _random_visible(settings: SparsePattern, p: Tensor, j: Tensor, table: Tensor) -> Tensor:
    """Whether key ``j`` lies in one of the random blocks of the block of query ``p`` (broadcast shapes),
    by looking the pair of blocks up in ``table`` (:func:`random_block_table`; element-wise, so
    FlexAttention's ``mask_mod`` can evaluate it too). Queries before the first key (p < 0) have none."""
    count = table.size(0)
    query_blocks = torch.div(p, settings.block, rounding_mode="floor").clamp(0, count - 1)
    key_blocks = torch.div(j, settings.block, rounding_mode="floor").clamp(0, count - 1)
    return (p >= 0) & table[query_blocks, key_blocks]


def pattern_visible(
    settings: SparsePattern, p: Tensor, j: Tensor, *, tk: int, causal: bool, table: Tensor | None = None
) -> Tensor:
    """Whether query position ``p`` (R, 1) may attend key position ``j`` ((1|R), S): a (R, S) bool tensor.

    The single definition of every pattern: :func:`pattern_mask` evaluates it on the full grid, the
    blockwise kernel on the keys each block gathers, FlexAttention's ``mask_mod`` one pair at a time (with
    ``table``, :func:`pattern_table`, drawn beforehand). Key padding is not part of it.
    """
    s = settings
    band = (p - j).abs() <= s.window
    if s.pattern in ("sliding_window", "global_window"):
        allowed = band
    elif s.pattern == "strided":
        allowed = band | (torch.remainder(p - j, s.stride) == 0)
    elif s.pattern == "fixed":
        same_block = torch.div(p, s.stride, rounding_mode="floor") == torch.div(
            j, s.stride, rounding_mode="floor"
        )
        allowed = same_block | (torch.remainder(j, s.stride) >= s.stride - s.summary)
    else:  # random_blocks
        if table is None:
            table = pattern_table(s, tk=tk, causal=causal, device=p.device)
        allowed = band | _random_visible(s, p, j, table)
    if s.num_global:
        allowed = allowed | ((p >= 0) & (p < s.num_global)) | (j < s.num_global)
    if causal:
        allowed = allowed & (j <= p)
    return allowed


def pattern_mask(
    settings: SparsePattern, tq: int, tk: int, *, causal: bool, device: torch.device | None = None
) -> Tensor:
    """The dense (Tq, Tk) bool mask of the pattern, True = may attend; queries are the last Tq positions.

    The kernel computes exactly softmax attention under ``pattern_mask & key padding`` without ever
    building this matrix; tests and documentation use it as the explicit form.
    """
    p = torch.arange(tq, device=device)[:, None] + (tk - tq)
    j = torch.arange(tk, device=device)[None, :]
    return pattern_visible(settings, p, j, tk=tk, causal=causal)


def pattern_covers_all(settings: SparsePattern, tq: int, tk: int) -> bool:
    """Whether every key is visible to every query of a (Tq, Tk) call (queries are the last Tq positions):
    the band reaches across all of them (``|p - j| <= max(Tq, Tk) - 1 <= window``), or for ``fixed`` all
    positions share one stride block. Causality and key padding only hide keys, so the call then equals
    dense attention under the same key and causal masks."""
    s = settings
    if s.pattern in _BANDED:
        return max(tq, tk) - 1 <= s.window
    return s.pattern == "fixed" and tq <= tk <= s.stride
