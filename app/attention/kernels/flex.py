"""Softmax attention through PyTorch's FlexAttention (``torch.nn.attention.flex_attention``): masks as block
sparsity, not as a dense (B, 1, Tq, Tk) tensor.

What each query may see is a ``mask_mod`` (key padding, causality with queries aligned to the end of the
keys, same packed sequence); :mod:`app.attention.kernels.flex_ops` turns it into a block mask, which skips
the tiles it empties (a short sentence's padding, the upper triangle, other sequences of a packed batch) and
shares it across the layers of one forward pass. Exact: the same numbers as the eager reference.

* Padded batches (:meth:`FlexAttention.forward`): q (B, H, Tq, Dh), k, v (B, Hkv, Tk, Dh), GQA/MQA through
  ``enable_gqa``, cross-attention (Tq != Tk) as well as self-attention.
* Packed batches (:meth:`FlexAttention.forward_packed`): the N tokens of B sequences laid end to end, one
  "document" mask over them: query and key in the same sequence, and for causal the key's position within
  it at most the query's. No padding exists anywhere, so none is computed.
* Decoding (one query, or a causal chunk of fewer queries than cached keys) goes to the sdpa kernel: a
  step's few scores leave no tile to skip, and building a block mask per step would cost more than it
  saves. Beam search expands cross-attention keys per beam for the same reason (``shares_keys`` False:
  shared keys would make every step a multi-query flex call with a mask of its own).

No attention weights (fused) and no attention dropout (FlexAttention has none): both are refused.
"""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from app.attention.base import AttentionKernel, AttentionOutput, KernelCapabilities
from app.attention.kernels import flex_ops
from app.attention.kernels.sdpa import SDPAttention
from app.attention.registry import register_kernel
from app.attention.segments import Segments

# Decoding steps go here (see the module docstring); stateless, so shared.
_STEP = SDPAttention()
DROPOUT_REASON = "FlexAttention has no dropout on attention weights"


def padded_mask_mod(key_mask: Tensor | None, *, causal: bool, offset: int) -> flex_ops.MaskMod | None:
    """Key padding (``key_mask`` (B, Tk), True at real keys) and causality (query i sees keys j <= i +
    ``offset``, offset = Tk - Tq) as a ``mask_mod``; None where nothing is hidden."""
    if key_mask is None and not causal:
        return None

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        if key_mask is None:
            return kv_idx <= q_idx + offset
        real = key_mask[b, kv_idx]
        return real & (kv_idx <= q_idx + offset) if causal else real

    return mask_mod


def packed_mask_mod(q_segments: Segments, k_segments: Segments, *, causal: bool) -> flex_ops.MaskMod:
    """The document mask of a packed batch: query and key of one sequence (and, causal, the key at or
    before the query's position within it)."""
    q_ids, k_ids = q_segments.ids, k_segments.ids
    q_pos, k_pos = q_segments.positions, k_segments.positions

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        same = q_ids[q_idx] == k_ids[kv_idx]
        return same & (k_pos[kv_idx] <= q_pos[q_idx]) if causal else same

    return mask_mod


def packed_owners(q_segments: Segments, k_segments: Segments) -> tuple[Tensor, ...]:
    """The tensors a packed batch's mask reads: the block mask cache's key."""
    return (q_segments.ids, q_segments.positions, k_segments.ids, k_segments.positions)


@register_kernel("flex")
class FlexAttention(AttentionKernel):
    """Exact softmax attention with FlexAttention block masks (see the module docstring)."""

    capabilities = KernelCapabilities(returns_weights=False, attention_dropout=False, shares_keys=False)
    reasons: ClassVar[dict[str, str]] = {
        "attention_dropout": DROPOUT_REASON,
        "returns_weights": "fused: the weights are never formed",
    }

    def __init__(self, *, compile: str | bool = "auto") -> None:
        super().__init__()
        # compile: auto (torch.compile of flex_attention on CUDA, its eager reference else), true, false
        self.compile = flex_ops.check_compile(compile)

    def extra_repr(self) -> str:
        return f"compile={self.compile!r}"

    def scores_per_query(self, length: int, *, head_dim: int) -> int:
        """Eager's 4 x length: the CPU's paths (the unfused reference, the dense form for a backward) keep
        every score. Compiled on a GPU nothing of the kind is kept; the bound only skips benchmark runs,
        and on a GPU's memory it skips none the default lengths ask for."""
        return 4 * length

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
        """q (B, H, Tq, Dh), k, v (B, Hkv, Tk, Dh), ``key_mask`` (B, Tk); the context (B, H, Tq, Dv)."""
        check_call(dropout_p=dropout_p, need_weights=need_weights)
        tq, tk = q.size(2), k.size(2)
        if tq == 1 or (causal and tq < tk):  # a decoding step (module docstring)
            return _STEP(q, k, v, key_mask=key_mask, causal=causal)
        mask_mod = padded_mask_mod(key_mask, causal=causal, offset=tk - tq)
        batch = None if key_mask is None else q.size(0)
        owners = () if key_mask is None else (key_mask,)
        context = flex_ops.attend(
            q, k, v, mask_mod, batch=batch, compile=self.compile, owners=owners, settings=("padded", causal)
        )
        return AttentionOutput(context=context)

    def forward_packed(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        q_segments: Segments,
        k_segments: Segments,
        causal: bool = False,
        dropout_p: float = 0.0,
    ) -> Tensor:
        """Packed q (Nq, H, Dh) over packed k, v (Nk, Hkv, Dh) under the document mask: (Nq, H, Dv)."""
        check_call(dropout_p=dropout_p, need_weights=False)
        mask_mod = packed_mask_mod(q_segments, k_segments, causal=causal)
        context = flex_ops.attend(
            q.transpose(0, 1)[None],  # (1, H, Nq, Dh): one row holds every sequence
            k.transpose(0, 1)[None],  # (1, Hkv, Nk, Dh)
            v.transpose(0, 1)[None],
            mask_mod,
            batch=None,
            compile=self.compile,
            owners=packed_owners(q_segments, k_segments),
            settings=("packed", causal),
        )
        return context[0].transpose(0, 1)  # (Nq, H, Dv)


def check_call(*, dropout_p: float, need_weights: bool) -> None:
    """Refuse what FlexAttention cannot do, naming the way out (a model build refuses dropout earlier)."""
    if need_weights:
        raise ValueError("the flex kernel cannot return attention weights; use kernel=eager")
    if dropout_p > 0:
        raise ValueError(f"the flex kernel cannot apply attention dropout ({DROPOUT_REASON}): set dropout=0")
