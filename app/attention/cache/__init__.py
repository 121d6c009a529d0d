"""Decoding caches, one kind per kind of kernel state; a kernel makes its own (``AttentionKernel.new_cache``).

- :class:`KVCache`: keys and values that grow by a step's positions (causal self-attention), a beam
  reorder held back until the next append; :class:`WindowCache` keeps only the last ``max_len`` of them
  (a sliding window), :class:`CodedKVCache` keeps each key's codes beside it (LSH buckets).
- :class:`StaticCache`: cross-attention keys and values, computed from the encoder output once;
  :class:`ReducedCache` holds them reduced along the source (Linformer, linear attention's sums).
- :class:`RecurrentCache`: a recurrent kernel's fixed-size state instead of keys and values.

Every kind answers one interface (:class:`AttentionCache`): ``attend`` (append or fill, then attend),
``reorder`` and ``select`` (beam search's rows and sentences), ``nbytes`` and ``filled``.
"""

from app.attention.cache.base import AttentionCache, CachedLayer, CacheKernel
from app.attention.cache.growing import CodedKVCache, KVCache, WindowCache, gathered
from app.attention.cache.recurrent import RecurrentCache, RecurrentState
from app.attention.cache.static import ReducedCache, StaticCache

__all__ = [
    "AttentionCache",
    "CacheKernel",
    "CachedLayer",
    "CodedKVCache",
    "KVCache",
    "RecurrentCache",
    "RecurrentState",
    "ReducedCache",
    "StaticCache",
    "WindowCache",
    "gathered",
]
