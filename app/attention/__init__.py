"""Pluggable attention: kernels behind one interface, a registry, masks and KV caches."""

from app.attention import kernels  # noqa: F401  (registers the built-in kernels)
from app.attention.base import AttentionKernel, AttentionOutput, KernelCapabilities
from app.attention.cache import KVCache
from app.attention.masks import attention_mask, causal_mask, padding_mask
from app.attention.multihead import MultiHeadAttention
from app.attention.registry import AttentionConfigError, available_kernels, build_kernel, register_kernel

__all__ = [
    "AttentionConfigError",
    "AttentionKernel",
    "AttentionOutput",
    "KVCache",
    "KernelCapabilities",
    "MultiHeadAttention",
    "attention_mask",
    "available_kernels",
    "build_kernel",
    "causal_mask",
    "padding_mask",
    "register_kernel",
]
