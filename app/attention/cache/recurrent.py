"""The decoding cache of a recurrent kernel: a fixed-size state instead of keys and values."""

from __future__ import annotations

from typing import Any, Protocol

from torch import Tensor

from app.attention.cache.base import AttentionCache, CachedLayer
from app.attention.output import AttentionOutput


class RecurrentState(Protocol):
    """What a recurrent kernel's decoding state offers, e.g. :class:`.kernels.linear.LinearAttentionState`."""

    def reorder(self, index: Tensor) -> Any:
        """The state with batch rows selected by ``index``."""
        ...

    def nbytes(self) -> int:
        """Bytes held by the state's tensors."""
        ...


class RecurrentCache(AttentionCache):
    """Causal self-attention's state for a recurrent kernel (``capabilities.recurrent``, e.g. causal
    linear attention, Katharopoulos et al. 2020, section 3.4): it summarises every earlier key and value
    in O(1) memory per step, so the cache does not grow with the length."""

    def __init__(self, state: RecurrentState | None = None) -> None:
        self.state = state  # None before the first step

    @property
    def filled(self) -> bool:
        return self.state is not None

    def attend(
        self,
        layer: CachedLayer,
        q: Tensor,
        source: Tensor,
        *,
        key_mask: Tensor | None,
        causal: bool,
        need_weights: bool,
    ) -> AttentionOutput:
        """Causal attention of the new positions ``source`` (B, t, D) from the state; updates the state.

        ``key_mask`` covers all keys so far (B, Tk) as for a KV cache; only its last t columns are new.
        """
        if not causal:
            raise ValueError("a recurrent cache serves causal self-attention: use a KVCache otherwise")
        if need_weights:
            raise ValueError(f"the {type(layer.kernel).__name__} kernel cannot return attention weights")
        k, v = layer.project_kv(source, q)  # (B, Hkv, t, Dh)
        step_mask = None if key_mask is None else key_mask[:, -source.size(1) :]  # (B, t)
        context, self.state = layer.kernel.recurrent_step(self.state, q, k, v, key_mask=step_mask)
        return AttentionOutput(context=context)  # (B, H, t, Dh)

    def reorder(self, rows: Tensor) -> None:
        """Select batch rows of the state."""
        if self.state is not None:
            self.state = self.state.reorder(rows)

    def nbytes(self) -> int:
        """Bytes held by the state."""
        return 0 if self.state is None else self.state.nbytes()
