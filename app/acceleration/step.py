"""The Transformer's cached decoding step as a function of plain tensors: what the packages compile.

A :class:`~app.models.transformer.TransformerState` holds cache objects that grow, hold back reorders and
carry per-kernel state; a compiler wants tensors in and tensors out. :class:`CacheTensors` reads a state's
caches as tensors and :func:`decode_cached` runs the model's own :meth:`decode_step
<app.models.transformer.Transformer.decode_step>` over fresh cache objects built around them, returning
the grown self-attention caches. AOTInductor (:mod:`app.acceleration.aot_step`) compiles this one function,
so a compiled step computes what the model computes, by construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from app.attention.cache import KVCache, ReducedCache, StaticCache, WindowCache
from app.models.transformer import LayerCache, TransformerState


@dataclass
class CacheTensors:
    """The tensors of a decoder's caches, one entry per layer (a compiled step's inputs/outputs)."""

    self_k: list[Tensor]  # (B*G, Hkv, T, Dh) each
    self_v: list[Tensor]
    cross_k: list[Tensor]  # (B, Hkv, S, Dh) each (or k reduced rows, or B*G rows: see MultiHeadAttention)
    cross_v: list[Tensor]
    cross_mask: list[Tensor | None]  # (B, 1 | Hkv, k) for kernels that reduce keys (linformer), else None
    windows: tuple[int | None, ...] = field(default=())  # each self cache's ``max_len`` (sliding windows)
    rows: Tensor | None = None  # (B*G,) with ``held``: the rows of self_k/self_v each decoder row goes on
    # from (a beam reorder not applied yet); None: self_k/self_v are the decoder's rows in order

    @classmethod
    def read(cls, caches: list[LayerCache], *, held: bool = False) -> CacheTensors | None:
        """The tensors of ``caches`` (a TransformerState's), or None before they are all filled (the first
        step) or where a kernel keeps recurrent state instead of keys and values.

        ``held``: the self-attention caches as stored, with the reorder they hold back as ``rows`` (for a
        step that gathers those rows as it appends, one copy instead of two); without it, or where the
        layers hold different reorders, the reorder is applied first."""
        for cache in caches:
            if not (
                isinstance(cache.self_attn, KVCache) and cache.self_attn.filled and cache.cross_attn.filled
            ):
                return None
        stored = [c.self_attn.held() for c in caches]
        rows = stored[0][2]
        if held and all(same_rows(pending, rows) for *_, pending in stored):
            self_k, self_v = [k for k, _, _ in stored], [v for _, v, _ in stored]
        else:
            self_k, self_v, rows = [c.self_attn.k for c in caches], [c.self_attn.v for c in caches], None
        return cls(
            self_k=self_k,
            self_v=self_v,
            rows=rows,
            cross_k=[c.cross_attn.k for c in caches],
            cross_v=[c.cross_attn.v for c in caches],
            cross_mask=[c.cross_attn.key_mask for c in caches],
            windows=tuple(c.self_attn.max_len for c in caches),
        )

    def caches(self) -> list[LayerCache]:
        """Fresh cache objects over these tensors (inside the compiled function, which selects no rows:
        a cross-attention cache's sharing by beams does not matter there)."""
        return [
            LayerCache(
                self_attn=KVCache(k=sk, v=sv) if window is None else WindowCache(k=sk, v=sv, max_len=window),
                cross_attn=StaticCache(k=ck, v=cv)
                if mask is None
                else ReducedCache(k=ck, v=cv, key_mask=mask),
            )
            for sk, sv, ck, cv, mask, window in zip(
                self.self_k,
                self.self_v,
                self.cross_k,
                self.cross_v,
                self.cross_mask,
                self.windows,
                strict=True,
            )
        ]


def same_rows(a: Tensor | None, b: Tensor | None) -> bool:
    """Whether two held-back reorders keep the same rows (None: none held)."""
    return a is b or (a is not None and b is not None and torch.equal(a, b))


def decode_cached(
    model: nn.Module,
    tokens: Tensor,
    step: int,
    memory: Tensor,
    memory_mask: Tensor,
    group: int,
    tensors: CacheTensors,
) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    """One step of ``model`` (a Transformer) over fresh cache objects; the new self-attention caches.

    ``tokens`` (B*G,), ``memory`` (B, S, D), ``memory_mask`` (B, S); returns log-probabilities
    (B*G, V) and each layer's self-attention keys and values (B*G, Hkv, T+1, Dh).
    """
    caches = tensors.caches()
    state = TransformerState(memory=memory, memory_mask=memory_mask, caches=caches, step=step, group=group)
    log_probs = model.decode_step(tokens, state)
    return log_probs, [c.self_attn.k for c in caches], [c.self_attn.v for c in caches]


def describe_failure(error: BaseException) -> str:
    """One line: the error's type and the first line of its root cause (dynamo wraps what inductor raised,
    as ``inner_exception`` of its BackendCompilerFailed, raised ``from None``)."""
    root = error
    while (inner := getattr(root, "inner_exception", None) or root.__cause__) is not None:
        root = inner
    message = next((line.strip() for line in str(root).splitlines() if line.strip()), "")
    kinds = type(error).__name__ if root is error else f"{type(error).__name__} <- {type(root).__name__}"
    return f"{kinds}: {message[:300]}"


def compile_available() -> str | None:
    """Why inductor cannot compile for the CPU here (no C++ compiler), or None when it can."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
    except Exception as error:
        return f"no C++ compiler for inductor ({type(error).__name__}: {error})"
    return None


def inference_only(model: nn.Module) -> bool:
    """Whether a compiled path may run: ``model`` in eval mode and no gradients being recorded (training
    and anything differentiated stays on the model's own code)."""
    return not model.training and not torch.is_grad_enabled()
