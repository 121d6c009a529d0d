"""PyTorch's fused ``scaled_dot_product_attention`` (flash / memory-efficient / math backends).

The padded path hands SDPA no mask or a float additive one of the smallest correct shape
(:func:`app.attention.masks.additive_mask`: key padding alone is a broadcast (B, 1, 1, Tk)), and on CUDA
names its backends in order: flash where there is no mask, memory-efficient with one, math last. Never
cuDNN: it builds a graph for every new shape, and token-bucketed batches keep making new shapes. On a CPU,
short bfloat16 calls take the math backend, which is faster there (:data:`CPU_BF16_MATH_UP_TO`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from app.attention.base import AttentionKernel, AttentionOutput, KernelCapabilities, repeat_kv
from app.attention.kernels.eager import EagerAttention
from app.attention.masks import additive_mask, rows_seeing_keys
from app.attention.registry import register_kernel

# The CUDA backends an unmasked and a masked call may use, in order of preference (flash takes no mask).
UNMASKED_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
MASKED_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
# Only flash takes grouped kv heads (enable_gqa) on CUDA, and only in these dtypes; the memory-efficient
# backend does not (torch 2.11-2.13), so elsewhere the kv heads are expanded rather than falling to math.
_GQA_FLASH_DTYPES = (torch.float16, torch.bfloat16)

# On a CPU in bfloat16, PyTorch's own choice (its flash kernel) loses to the math backend up to about 128 keys
# and wins beyond (forward+backward, 4 heads of 64, one thread; math's time over flash's: 0.45 at 48 keys,
# 0.71-0.77 at 128, 1.12 at 192, 1.21-1.29 at 256; docs/attention.md). In float32 it is not slower.
CPU_BF16_MATH_UP_TO = 128

# (q, k, v, additive mask or None, is_causal) -> context: one SDPA call, as a kernel makes it.
SDPACall = Callable[[Tensor, Tensor, Tensor, Tensor | None, bool], Tensor]


def attend_padded(
    q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, causal: bool, call: SDPACall
) -> Tensor:
    """Masked softmax attention of ``q`` (B, H, Tq, Dh) over ``k``, ``v`` (B, Hkv, Tk, Dh) through ``call``.

    No mask where none is needed (``is_causal`` covers causal attention when Tq == Tk: SDPA aligns it
    top-left); else the smallest float mask. Query rows with no visible key (a sequence without keys, a
    causal query before its sequence's first key) are found from the (B, Tk) key mask and give zeros.
    """
    tq, tk = q.size(2), k.size(2)
    if key_mask is None and (not causal or tq == tk):
        return call(q, k, v, None, causal)
    has_keys = rows_seeing_keys(key_mask, causal=causal, tq=tq, tk=tk, device=q.device)  # (B|1, 1, Tq|1, 1)
    mask = additive_mask(
        key_mask, causal=causal, tq=tq, tk=tk, dtype=q.dtype, device=q.device, has_keys=has_keys
    )  # (B|1, 1, Tq|1, Tk)
    context = call(q, k, v, mask, False)
    return context if has_keys is None else context.masked_fill(~has_keys, 0.0)


def sdpa_in_order(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, dropout_p: float = 0.0
) -> Tensor:
    """SDPA with the backend chosen explicitly: on CUDA by the module docstring's order; on a CPU (no graphs
    are built there) math for short bfloat16 calls (:data:`CPU_BF16_MATH_UP_TO`), else PyTorch's choice
    (its flash kernel, which takes masks and grouped heads)."""
    gqa = k.size(1) != q.size(1)
    if q.device.type == "cuda":
        if gqa and (mask is not None or q.dtype not in _GQA_FLASH_DTYPES):
            k, v, gqa = repeat_kv(k, q.size(1)), repeat_kv(v, q.size(1)), False  # (B, H, Tk, Dh)
        backends = UNMASKED_BACKENDS if mask is None else MASKED_BACKENDS
    elif q.dtype == torch.bfloat16 and isinstance(k.size(2), int) and k.size(2) <= CPU_BF16_MATH_UP_TO:
        backends = [SDPBackend.MATH]
    else:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, enable_gqa=gqa
        )
    with sdpa_kernel(backends, set_priority=True):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, enable_gqa=gqa
        )


# One query row per sentence (a cached decoding step) of many sentences on a CPU: the fused call pays a fixed
# cost per (row, head) pair, so above ~256 pairs the reference kernel's two batched products win (2.9x at
# 320 rows x 4 heads x 30 keys), below they lose (3x slower at one row): scripts/bench_step_ops.py, one
# thread. Same function; stateless, so shared.
_EXPLICIT = EagerAttention()
EXPLICIT_FROM_PAIRS = 256


def explicit_wins(pairs: int | torch.SymInt) -> bool:
    """Whether one query row of ``pairs`` (row, head) pairs is computed by the reference kernel.

    A program exported for any batch (an ahead-of-time package of several sentences, its row count
    symbolic) cannot branch on the count without constraining it to one side; it takes the reference
    kernel's products, which the packages of the eager kernel run at every size.
    """
    if not isinstance(pairs, int) and torch.compiler.is_exporting():
        return True
    return pairs > EXPLICIT_FROM_PAIRS


@register_kernel("sdpa")
class SDPAttention(AttentionKernel):
    """Fused attention; never materialises weights, so ``need_weights`` is unsupported."""

    capabilities = KernelCapabilities(returns_weights=False, shares_keys=True)

    def scores_per_query(self, length: int, *, head_dim: int) -> int:
        return 0  # fused: the scores live in on-chip tiles, never as a (T, T) tensor

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        key_mask: Tensor | None = None,
        causal: bool = False,
        dropout_p: float = 0.0,
        need_weights: bool = False,
    ) -> AttentionOutput:
        if need_weights:
            raise ValueError("the sdpa kernel cannot return attention weights; use kernel=eager")
        tq = q.size(2)
        if tq == 1 and dropout_p == 0.0 and explicit_wins(q.size(0) * q.size(1)) and q.device.type == "cpu":
            return _EXPLICIT(q, k, v, key_mask=key_mask, causal=causal)
        causal = causal and tq > 1  # one query (cached decoding) sits at the last key: it sees them all
        call = functools.partial(sdpa_in_order, dropout_p=dropout_p)
        return AttentionOutput(context=attend_padded(q, k, v, key_mask, causal, call))
