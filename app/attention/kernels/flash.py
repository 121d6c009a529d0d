"""Fused softmax attention with an explicit backend choice, and padding-free flash-attn on GPUs.

``backend`` picks what :func:`torch.nn.functional.scaled_dot_product_attention` may use, through
:func:`torch.nn.attention.sdpa_kernel`: ``flash`` (FlashAttention-2, Dao 2023), ``efficient``
(memory-efficient attention, Rabe & Staats 2021), ``math`` (the unfused reference) or ``auto``
(PyTorch's own choice). A backend that cannot run a call (no kernel for the device, dtype, mask or
head size -- on CPU, ``efficient`` never can) falls back to ``math``; the reason is logged once per
kernel instance.

With the ``flash_attn`` package installed and fp16/bf16 tensors on a CUDA device, ``auto`` and
``flash`` call flash-attn directly (Dao et al. 2022; Dao 2023): key padding is removed before the call
(``flash_attn_varlen_func``: every sequence keeps only its real keys), so no work is spent on padding.
Causal attention with key padding stays on SDPA: unpadding would move where the causal diagonal sits.

SDPA gets no mask or the smallest float additive one, as in the sdpa kernel
(:func:`app.attention.kernels.sdpa.attend_padded`); unlike that kernel, ``auto`` leaves the backend to
PyTorch (cuDNN included, where PyTorch prefers it), so that ``backend`` names exactly what runs. Query rows
whose keys are all hidden give zeros, never NaN.
"""

from __future__ import annotations

import functools
import logging
import re
import warnings
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from app.attention.base import AttentionKernel, AttentionOutput, KernelCapabilities
from app.attention.kernels.sdpa import attend_padded
from app.attention.registry import AttentionConfigError, register_kernel

log = logging.getLogger(__name__)

BACKENDS: dict[str, SDPBackend | None] = {
    "auto": None,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
# How PyTorch reports that no enabled backend can run a call (the CUDA and the CPU wording).
_NO_KERNEL = re.compile(r"No available kernel|No viable backend")
_FLASH_ATTN_DTYPES = (torch.float16, torch.bfloat16)


@functools.cache
def flash_attn_module() -> ModuleType | None:
    """The ``flash_attn`` package if it imports and is >= 2.1 (bottom-right causal alignment), else None."""
    try:
        import flash_attn
    except (ImportError, OSError):  # not installed, or built against another CUDA / torch
        return None
    version = tuple(int(part) for part in re.findall(r"\d+", flash_attn.__version__)[:2])
    return flash_attn if version >= (2, 1) else None


@register_kernel("flash")
class FlashAttention(AttentionKernel):
    """SDPA under a chosen backend (math fallback), or flash-attn's padding-free kernels on GPUs."""

    capabilities = KernelCapabilities(
        padding_mask=True, causal=True, returns_weights=False, incremental=True, exact=True, shares_keys=True
    )

    def __init__(self, *, backend: str = "auto") -> None:
        super().__init__()
        if backend not in BACKENDS:
            raise AttentionConfigError(
                f"unknown flash attention backend {backend!r}; valid choices: {', '.join(BACKENDS)}"
            )
        self.backend = backend
        self._falls_back: set[tuple] = set()  # call signatures the chosen backend could not run
        self._warned = False

    def extra_repr(self) -> str:
        return f"backend={self.backend!r}"

    def describe(self) -> str:
        return f"{self.name} backend={self.backend}"

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
            raise ValueError("the flash kernel cannot return attention weights; use kernel=eager")
        causal = (
            causal and q.size(2) > 1
        )  # one query (cached decoding) sits at the last key: it sees them all
        if self._can_use_flash_attn(q, k, v, key_mask, causal):
            return AttentionOutput(context=self._flash_attn(q, k, v, key_mask, causal, dropout_p))
        return AttentionOutput(context=self._sdpa(q, k, v, key_mask, causal, dropout_p))

    # --- torch SDPA -------------------------------------------------------------------------------------

    def _sdpa(
        self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, causal: bool, dropout_p: float
    ) -> Tensor:
        gqa = k.size(1) != q.size(1)
        call = functools.partial(self._call_sdpa, dropout_p=dropout_p, gqa=gqa)
        return attend_padded(q, k, v, key_mask, causal, call)  # no mask, or the smallest float one

    def _call_sdpa(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        is_causal: bool,
        dropout_p: float,
        gqa: bool,
    ) -> Tensor:
        def attend() -> Tensor:
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, enable_gqa=gqa
            )

        chosen = BACKENDS[self.backend]
        if chosen is None:
            return attend()
        signature = (q.device.type, q.dtype, mask is not None, is_causal, gqa, dropout_p > 0, q.requires_grad)
        if chosen is not SDPBackend.MATH and signature not in self._falls_back:
            with warnings.catch_warnings(record=True) as caught:  # PyTorch explains refusals as warnings
                warnings.simplefilter("always")
                try:
                    with sdpa_kernel(chosen):
                        return attend()
                except RuntimeError as err:
                    if not _NO_KERNEL.search(str(err)):
                        raise
                    reasons = [str(w.message) for w in caught] or [str(err)]
            self._falls_back.add(signature)
            self._warn_fallback(signature, reasons)
        with sdpa_kernel(SDPBackend.MATH):
            return attend()

    def _warn_fallback(self, signature: tuple, reasons: list[str]) -> None:
        if self._warned:
            return
        self._warned = True
        device, dtype, masked, is_causal, gqa, dropout, _ = signature
        log.warning(
            "flash kernel: SDPA backend %r cannot run on %s %s (mask=%s, is_causal=%s, gqa=%s, dropout=%s): "
            "%s; falling back to 'math' (logged once per kernel)",
            self.backend,
            device,
            dtype,
            masked,
            is_causal,
            gqa,
            dropout,
            " | ".join(" ".join(r.split()) for r in reasons),
        )

    # --- flash-attn (CUDA, fp16/bf16) ---------------------------------------------------------------------

    def _can_use_flash_attn(
        self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, causal: bool
    ) -> bool:
        return (
            self.backend in ("auto", "flash")
            and q.is_cuda
            and q.dtype in _FLASH_ATTN_DTYPES
            and k.dtype == v.dtype == q.dtype
            and q.size(-1) == v.size(-1) <= 256
            and q.size(2) > 0
            and not (causal and key_mask is not None)
            and flash_attn_module() is not None
        )

    def _flash_attn(
        self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, causal: bool, dropout_p: float
    ) -> Tensor:
        """flash-attn on (B, T, H, Dh) layouts; key padding removed first (varlen) when there is any.

        flash-attn >= 2.1 aligns the causal diagonal bottom-right (query i sees keys j <= i + Tk - Tq),
        the convention of :mod:`app.attention.base`, and returns zeros for rows with no visible key.
        """
        fa = flash_attn_module()
        batch, heads, tq, dim = q.shape
        q_bthd, k_bthd, v_bthd = (t.transpose(1, 2) for t in (q, k, v))  # (B, T, H|Hkv, Dh)
        if key_mask is None or bool(key_mask.all()):
            out = fa.flash_attn_func(q_bthd, k_bthd, v_bthd, dropout_p=dropout_p, causal=causal)
            return out.transpose(1, 2)  # (B, H, Tq, Dh)
        lengths = key_mask.sum(dim=1, dtype=torch.int32)  # (B,) real keys per sequence
        cu_k = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))  # (B + 1,)
        cu_q = torch.arange(0, (batch + 1) * tq, tq, dtype=torch.int32, device=q.device)  # queries unpadded
        out = fa.flash_attn_varlen_func(
            q_bthd.reshape(batch * tq, heads, dim),
            k_bthd[key_mask],  # (sum of lengths, Hkv, Dh), sequence after sequence
            v_bthd[key_mask],
            cu_q,
            cu_k,
            tq,
            max(int(lengths.max()), 1),
            dropout_p=dropout_p,
            causal=False,
        )
        context = out.view(batch, tq, heads, dim).transpose(1, 2)  # (B, H, Tq, Dh)
        return context.masked_fill((lengths == 0)[:, None, None, None], 0.0)  # sequences with no key
