"""oneDNN-packed weights for the linears of a model that decodes on a CPU.

Why: a decoding step multiplies a few rows (one per sentence, or per beam) by every weight of the decoder.
For the wide linears (the feed-forward pair and the output layer) oneDNN's matrix product over a weight
reordered once into its own blocked layout beat MKL's over the column-major weight
(:mod:`app.acceleration.weight_layout`) on the CPUs measured here, from 2 rows up: the output layer of the
quickstart model (256 -> 8,000) 1.9-2.6x at 2-8 rows, 1.45x at 34, 1.14-1.18x at 212-320; the feed-forward
pair 1.1-1.7x. (CTranslate2 uses oneDNN's SGEMM on these CPUs.) At one row, and for the narrow d x d
projections below ~128 rows, MKL was as fast or faster, so those keep it (``python
scripts/bench_step_ops.py`` prints the comparison); from 128 rows (the encoder, beam 5 at batch 64) the
narrow ones go through oneDNN too, sparing MKL the copy of its weight operand it makes on every call.

:func:`pack_wide_linears` gives each ``nn.Linear`` a packed copy of its weight and a forward that uses it
when it applies: float32 on a CPU, 2 rows or more (:data:`NARROW_MIN_ROWS` for fewer than
:data:`MIN_WEIGHTS` weights), inference (no gradient, no autocast, not being traced by ``torch.compile``),
and the weight unchanged since it was packed (its version counter; a weight written in place, e.g. by
``load_state_dict``, falls back to ``F.linear`` until packed again). Everywhere else the layer is the plain
``nn.Linear``. The packed copy is an attribute, not a parameter or buffer: state dicts and parameter
counts are unchanged. Results differ from ``F.linear`` only by float32 rounding (a different summation
order).
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import Tensor, nn

MIN_WEIGHTS = 1 << 18  # 256 x 1,024: the feed-forward pair and output layers, packed from 2 rows
NARROW_MIN_ROWS = 128  # smaller weights (d x d projections) go through oneDNN from this many rows
PACKED_FOR_ROWS = 64  # the row count oneDNN is told to expect; the measured speed barely depended on it


def onednn_linear_available() -> bool:
    """Whether this torch build has oneDNN's linear operators (CPU builds with mkldnn)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def pack_wide_linears(model: nn.Module, min_weights: int = MIN_WEIGHTS) -> int:
    """Pack the weight of every float32 CPU ``nn.Linear`` of ``model`` for oneDNN; returns how many. Those
    with at least ``min_weights`` weights use it from 2 rows, the others from :data:`NARROW_MIN_ROWS`. Call
    it on a model loaded to decode; a no-op where oneDNN is missing."""
    if not onednn_linear_available():
        return 0
    packed = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if not isinstance(module, nn.Linear) or weight is None:
            continue
        if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.is_inference():
            continue  # (an inference tensor has no version counter to tell a changed weight by)
        module.packed_weight = pack_weight(weight)
        module.packed_version = weight._version
        module.packed_min_rows = 2 if weight.numel() >= min_weights else NARROW_MIN_ROWS
        module.forward = types.MethodType(packed_forward, module)
        packed += 1
    return packed


def uses_packed(module: nn.Linear, x: Tensor) -> bool:
    """Whether ``x`` goes through the packed weight (see the module's docstring for the conditions)."""
    return (
        not torch.compiler.is_compiling()  # first: nothing below is traced
        and x.dtype == torch.float32
        and x.device.type == "cpu"
        and x.numel() >= module.packed_min_rows * x.size(-1)
        and not module.training
        and not torch.is_grad_enabled()
        and not torch.is_autocast_enabled("cpu")
        and module.weight._version == module.packed_version
    )


def packed_forward(self: nn.Linear, x: Tensor) -> Tensor:
    """``nn.Linear.forward`` through the packed weight where it applies: x (..., in) -> (..., out)."""
    if not uses_packed(self, x):
        return F.linear(x, self.weight, self.bias)
    out = packed_product(x.reshape(-1, x.size(-1)), self.packed_weight, self.bias)  # (N, out)
    return out.view(*x.shape[:-1], out.size(-1))


def pack_weight(weight: Tensor) -> Tensor:
    """``weight`` (out, in) reordered into oneDNN's blocked layout (an opaque mkldnn tensor)."""
    with torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACKED_FOR_ROWS)


def packed_product(rows: Tensor, packed: Tensor, bias: Tensor | None) -> Tensor:
    """rows (N, in) @ W^T + bias through oneDNN, W packed by :func:`pack_weight`: (N, out)."""
    return torch.ops.mkldnn._linear_pointwise(rows.contiguous(), packed, bias, "none", [], "")
