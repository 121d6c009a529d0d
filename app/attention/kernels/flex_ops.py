"""FlexAttention plumbing shared by the kernels that use it (flex, sparse ``backend=flex``).

A kernel describes *which* keys each query may see as a ``mask_mod(b, h, q_idx, kv_idx) -> bool``;
:func:`attend` turns it into a block mask (``create_block_mask``: per 128 x 128 tile, empty, full or
partial) and runs ``flex_attention``, which skips the empty tiles and evaluates the ``mask_mod`` only in the
partial ones. No dense (B, 1, Tq, Tk) mask reaches the attention call.

Three ways to run, one mask definition:

* compiled (CUDA; ``compile=auto`` there): ``torch.compile`` of ``flex_attention`` alone. FlexAttention's
  fused kernel *is* what the compiler generates from the ``mask_mod``; uncompiled, ``flex_attention`` is an
  unfused reference that materialises every score. Compiling that one function keeps the model eager
  (the house style: speed wraps from the call site), and a whole-model ``compile=true`` still composes.
* eager (CPU; ``compile=auto`` there): that unfused reference, forward only -- torch has no FlexAttention
  backward on the CPU (2.13: ``NotImplementedError``).
* dense (CPU, when autograd needs a backward): the same ``mask_mod`` evaluated on the full grid
  (``create_mask``) and handed to SDPA. So CPU training with a flex kernel runs, gives the numbers a GPU
  gives, and is as slow as a dense masked kernel; tests check the eager and dense paths against the
  reference kernel.

Block masks cost a ``mask_mod`` evaluation over the (Tq, Tk) grid (on a GPU, compiled): :class:`MaskCache`
builds one per forward pass (the CPU's dense masks likewise) and shares it across layers, keyed by the
identity of the tensors that define it (the key mask, the segments' ids), which every layer of one pass
receives unchanged.
"""

from __future__ import annotations

import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, create_mask, flex_attention

from app.attention.base import rows_with_keys
from app.attention.registry import AttentionConfigError

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
Mask = BlockMask | Tensor  # a block mask, or the dense bool (B|1, 1, Tq, Tk) form of the CPU's backward path
# The one warning uncompiled flex_attention gives (once per process): that it is an unfused reference. On
# the CPU that is what we ask for (tests, CPU runs), so it is silenced there, and only it.
_UNCOMPILED_WARNING = r"flex_attention called without torch\.compile"


def check_compile(value: object) -> str | bool:
    """A kernel's ``compile`` option: ``auto`` (compiled on CUDA, eager elsewhere), true or false."""
    if not (value is True or value is False or value == "auto"):
        raise AttentionConfigError(f"flex attention compile={value!r}; valid choices: auto, true, false")
    return value  # type: ignore[return-value]


def compiled_on(setting: str | bool, device: torch.device) -> bool:
    """Whether ``flex_attention`` runs compiled for tensors on ``device``."""
    return device.type == "cuda" if setting == "auto" else bool(setting)


@lru_cache(maxsize=1)
def _compiled_flex() -> Callable[..., Tensor]:
    """``flex_attention`` compiled once per process (shapes recompile as torch.compile decides: static for
    the first shape, dynamic after a second)."""
    return torch.compile(flex_attention)


def _run(q: Tensor, k: Tensor, v: Tensor, block_mask: BlockMask | None, *, compiled: bool) -> Tensor:
    gqa = q.size(1) != k.size(1)
    if compiled:
        return _compiled_flex()(q, k, v, block_mask=block_mask, enable_gqa=gqa)
    with warnings.catch_warnings():  # see _UNCOMPILED_WARNING: the reference is what is asked for here
        warnings.filterwarnings("ignore", message=_UNCOMPILED_WARNING, category=UserWarning)
        return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=gqa)


def _dense(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """SDPA under the dense bool ``mask`` (B|1, 1, Tq, Tk); rows without a visible key are zero."""
    gqa = q.size(1) != k.size(1)
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    return context if mask is None else context.masked_fill(~rows_with_keys(mask), 0.0)


class MaskCache:
    """The last few masks, keyed by the identity (and version) of the tensors that define them plus
    the call's shape and settings, so that the layers of one forward pass build a mask once. A dead or
    modified owner tensor never matches, so a new batch builds anew; entries hold the owners weakly."""

    def __init__(self, size: int = 16) -> None:
        self.size = size
        self._entries: OrderedDict[Hashable, tuple[list[weakref.ref], Mask]] = OrderedDict()
        self.built = 0  # masks built so far (tests read it)

    def get(self, owners: tuple[Tensor, ...], settings: Hashable, build: Callable[[], Mask]) -> Mask:
        # inference tensors keep no version counter (and cannot change outside inference mode)
        key = (tuple((id(t), -1 if t.is_inference() else t._version) for t in owners), settings)
        entry = self._entries.get(key)
        if entry is not None and all(ref() is t for ref, t in zip(entry[0], owners, strict=True)):
            self._entries.move_to_end(key)
            return entry[1]
        mask = build()
        self.built += 1
        # A batch gone, its dense masks go (a block mask's mask_mod holds its owners: the size bounds those).
        for stale in [old for old, (refs, _) in self._entries.items() if any(ref() is None for ref in refs)]:
            del self._entries[stale]
        self._entries[key] = ([weakref.ref(t) for t in owners], mask)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return mask


MASKS = MaskCache()


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask_mod: MaskMod | None,
    *,
    batch: int | None,
    compile: str | bool,
    owners: tuple[Tensor, ...] = (),
    settings: Hashable = None,
) -> Tensor:
    """Softmax attention of ``q`` (B, H, Tq, Dh) over ``k``, ``v`` (B, Hkv, Tk, Dh|Dv) where ``mask_mod``
    allows (None: every key); returns the context (B, H, Tq, Dv), zero for rows that see no key.

    ``batch``: the mask's batch size (None when the mask is the same for every row of the batch);
    ``owners`` and ``settings``: what the mask depends on besides the shapes, the :class:`MaskCache` key
    (the ``mask_mod`` may read only those tensors).
    """
    tq, tk = q.size(2), k.size(2)
    if q.device.type == "cpu" and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        # No FlexAttention backward on the CPU: the same mask_mod, densely, through SDPA (module docstring).
        mask = None
        if mask_mod is not None:
            build_dense = lambda: create_mask(mask_mod, batch, None, tq, tk, device=q.device)  # noqa: E731
            mask = MASKS.get(owners, ("dense", batch, tq, tk, settings), build_dense)  # (B|1, 1, Tq, Tk)
        return _dense(q, k, v, mask)
    compiled = compiled_on(compile, q.device)
    block_mask = None
    if mask_mod is not None:
        shape = ("block", batch, tq, tk, q.device, compiled, settings)

        def build() -> BlockMask:
            # _compile: build the block mask with a compiled mask_mod, without the dense grid (as PyTorch's
            # own examples do on CUDA); on the CPU the grid is small enough
            return create_block_mask(mask_mod, batch, None, tq, tk, device=q.device, _compile=compiled)

        block_mask = MASKS.get(owners, shape, build)
    return _run(q, k, v, block_mask, compiled=compiled)
