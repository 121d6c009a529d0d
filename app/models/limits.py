"""Bounds on what a model config may ask for, and the check that saved weights fit a config before the
model is built for real.

A checkpoint carries both a config and the weights, and the config decides what is allocated: a file of
a few hundred kilobytes whose config says ``encoder_layers=100000`` or ``max_positions=10**9`` would make
``build_model`` allocate gigabytes before ``load_state_dict`` could notice anything. So, in this order:

1. :func:`check_sizes`: the config's sizes stay under :data:`SIZE_BOUNDS` (layers, positions, heads,
   widths), checked on the numbers alone. ``build_model`` applies it to every config, training's too, so
   no run writes a checkpoint that would then be refused.
2. :func:`build_for_weights`: the model is built under an allocation budget (twice the bytes the file
   stores, plus :data:`EXTRA_BYTES` for tables that are not saved, such as the sinusoidal positions),
   refused before the allocation that would pass it, and must then hold exactly the tensors the file
   holds, name for name and shape for shape. The check reads no parameter names, so it holds for any
   model family or option.

After both, building the model costs about what the file's weights occupy.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

MAX_LAYERS = 64
MAX_POSITIONS = 32768  # docs/ablation.md's long-input runs use 20,480
MAX_HEADS = 1024
MAX_WIDTH = 65536
EXTRA_BYTES = 128 * 2**20
"""What building a model from a checkpoint may allocate beyond twice the bytes of the weights the file
stores (twice: a file may store in 16 bits what the model holds in 32), for what it computes: the
sinusoidal position table and its float64 temporaries (every allocation counts, freed or not: about
28 bytes per position and width, 56 MiB for 4,096 x 512)."""

# (key pattern, largest value, what it counts): integer settings of the model config they match must lie
# in 1..largest. Keys match by their ending, so a new family's ``*_layers`` or ``*_size`` is bounded too.
SIZE_BOUNDS: tuple[tuple[str, int, str], ...] = (
    (r"layers$", MAX_LAYERS, "layers"),
    (r"positions$", MAX_POSITIONS, "positions"),
    (r"heads$", MAX_HEADS, "heads"),
    (r"(^d_|_size$|_dim$)", MAX_WIDTH, "width"),
)


def check_sizes(model_cfg: Mapping[str, Any]) -> None:
    """Raise ValueError naming the first integer setting of ``model_cfg`` outside :data:`SIZE_BOUNDS`."""
    for key, value in model_cfg.items():
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        for pattern, largest, what in SIZE_BOUNDS:
            if re.search(pattern, key) and not 1 <= value <= largest:
                raise ValueError(f"model.{key}={value} is out of bounds: {what} must lie in 1..{largest:,}")


_FACTORIES = frozenset({"empty", "zeros", "ones", "full", "rand", "randn", "randint"})


def _arange_length(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """How many numbers ``torch.arange(*args, **kwargs)`` makes: arange(end), (start, end[, step])."""
    numbers = [float(a) for a in args if isinstance(a, (int, float)) and not isinstance(a, bool)]
    start, end, step = (0.0, numbers[0], 1.0) if len(numbers) == 1 else (0.0, None, 1.0)
    if len(numbers) >= 2:
        start, end, step = numbers[0], numbers[1], numbers[2] if len(numbers) > 2 else 1.0
    start, end, step = kwargs.get("start", start), kwargs.get("end", end), kwargs.get("step", step)
    return max(math.ceil((end - start) / step), 0) if end is not None and step else 0


def _new_bytes(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """The bytes ``func(*args, **kwargs)`` will allocate, worked out before calling it: from the size
    a factory is given (``torch.empty(3, 4)``, ``torch.full((3, 4), 1.0)``, ``torch.arange(n)``), else
    from the broadcast shape of the tensors it takes (an elementwise op); 0 where neither tells."""
    name = getattr(func, "__name__", "")
    if name == "arange":
        return _arange_length(args, kwargs) * 8  # int64 or float64 at most
    if name in _FACTORIES:
        size = kwargs.get("size")
        if size is None:
            sequences = [a for a in args if isinstance(a, (list, tuple))]
            size = sequences[0] if sequences else [a for a in args if isinstance(a, int)]
        dtype = kwargs.get("dtype") or torch.get_default_dtype()
        return math.prod(n for n in size if isinstance(n, int)) * dtype.itemsize
    tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
    if not tensors:
        return 0
    try:
        shape = torch.broadcast_shapes(*(t.shape for t in tensors))
    except RuntimeError:  # not an elementwise op (a matrix product, say): counted once it ran
        return 0
    return math.prod(shape) * max(t.element_size() for t in tensors)


class _AllocationBudget(TorchFunctionMode):
    """Counts the bytes of the tensors torch functions create (not views or in-place results) and
    raises ValueError before an allocation would pass ``limit`` (or once one that could not be
    foreseen has). A torch-function mode, not a dispatch mode or the meta device: those import
    ``torch._dynamo``, seconds that every ``translate.py`` would pay."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit, self.used = limit, 0

    def _charge(self, size: int, func: Callable[..., Any]) -> None:
        if self.used + size > self.limit:
            name = getattr(func, "__name__", str(func))
            raise ValueError(f"building it would allocate over {self.limit:,} bytes (at torch.{name})")

    def __torch_function__(self, func, types, args=(), kwargs=None):  # torch's signature
        kwargs = kwargs or {}
        self._charge(_new_bytes(func, args, kwargs), func)
        out = func(*args, **kwargs)
        inputs = {
            t.untyped_storage().data_ptr() for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)
        }
        if isinstance(out, torch.Tensor) and out.untyped_storage().data_ptr() not in inputs:
            size = out.untyped_storage().nbytes()
            self._charge(size, func)
            self.used += size
        return out


def stored_bytes(weights: Mapping[str, torch.Tensor]) -> int:
    """The bytes the file really stores for ``weights``, each storage once (tied weights share one).
    Raises ValueError for a tensor that claims more data than its storage holds (a zero-stride view
    can describe a huge tensor over a few bytes)."""
    storages: dict[int, int] = {}
    for name, tensor in weights.items():
        storage = tensor.untyped_storage()
        available = storage.nbytes() - tensor.storage_offset() * tensor.element_size()
        if tensor.numel() * tensor.element_size() > available:
            raise ValueError(
                f"weight {name} {tuple(tensor.shape)} claims more data than the file stores for it"
            )
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def _differences(model: nn.Module, weights: Mapping[str, torch.Tensor]) -> list[str]:
    """What differs between the tensors a model saves and those a file holds (at most 5 lines)."""
    planned = {name: tuple(value.shape) for name, value in model.state_dict().items()}
    lines = [f"{name} is missing" for name in planned if name not in weights]
    lines += [f"{name} is not in the model" for name in weights if name not in planned]
    lines += [
        f"{name}: the config asks for {shape}, the file holds {tuple(weights[name].shape)}"
        for name, shape in planned.items()
        if name in weights and tuple(weights[name].shape) != shape
    ]
    return lines[:5]


def build_for_weights(build: Callable[[], nn.Module], weights: Mapping[str, torch.Tensor]) -> nn.Module:
    """``build()``, allowed to allocate at most twice :func:`stored_bytes` of ``weights`` plus
    :data:`EXTRA_BYTES`, and then checked to save exactly ``weights``' names and shapes.

    Raises ValueError when the budget runs out (before the allocation that would pass it) or the
    tensors differ, so a config that asks for more than its file holds costs at most the budget.
    """
    limit = 2 * stored_bytes(weights) + EXTRA_BYTES
    try:
        with _AllocationBudget(limit):
            model = build()
    except ValueError as err:
        if "building it would allocate" not in str(err):
            raise
        raise ValueError(
            f"the config asks for more than its weights hold: {err}; the limit is twice the "
            f"{limit - EXTRA_BYTES >> 1:,} bytes of weights the file stores plus {EXTRA_BYTES >> 20} MiB"
        ) from err
    differences = _differences(model, weights)
    if differences:
        raise ValueError("the weights do not fit the model its config describes: " + "; ".join(differences))
    return model
