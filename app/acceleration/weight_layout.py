"""Linear weights stored for decoding on a CPU: column-major, so the matrix products read them row by row.

Why: ``nn.Linear`` keeps its weight as (out, in), row-major, and computes x @ W^T. A decoding step multiplies
few rows (one per sentence or beam) by every weight of the decoder and the output layer, so the step is bound
by how fast the weights stream from memory, not by arithmetic. On the CPUs measured here (MKL's float32
GEMM, one thread) the transposed operand of x @ W^T streams at about half the speed of a plain (in, out)
matrix: a batch-1 step's linears took 2.2 ms as trained and 1.1 ms with W^T contiguous; the gap closes as
rows grow (1.16x at 64 rows, 1.05x at 320), where the products become compute-bound.

:func:`store_column_major` keeps each weight's values, shape and parameter object, and changes only its
memory layout: the parameter becomes a (out, in) view of a contiguous (in, out) tensor, so ``weight.t()``
is contiguous and ``F.linear`` hands the GEMM the fast layout with no code change and no copy. Tied weights
(the output layer and the target embedding, one parameter) move once and stay tied; an embedding lookup
reads its rows strided, a few hundred numbers per token. Only for models loaded to decode: a model being
trained keeps the layout its optimizer state was made with.
"""

from __future__ import annotations

import torch
from torch import nn


def store_column_major(model: nn.Module) -> int:
    """Give every ``nn.Linear`` weight of ``model`` column-major storage (values unchanged); returns how many
    parameters moved. Weights already column-major (or shared and moved already) are left as they are."""
    moved = 0
    for module in model.modules():
        if isinstance(module, nn.Linear) and not is_column_major(module.weight):
            with torch.no_grad():
                module.weight.data = module.weight.data.t().contiguous().t()
            moved += 1
    return moved


def is_column_major(weight: torch.Tensor) -> bool:
    """True when ``weight`` (out, in) is the transpose of a contiguous (in, out) tensor."""
    return weight.dim() == 2 and weight.t().is_contiguous()
