"""Pluggable attention: Transformer kernels and RNN mechanisms, each behind an interface and a registry."""

from app.attention import (  # noqa: F401  (register kernels and RNN mechanisms)
    additive,
    kernels,
    luong,
)
from app.attention.base import AttentionKernel, AttentionOutput, KernelCapabilities
from app.attention.cache import AttentionCache, KVCache, StaticCache
from app.attention.masks import attention_mask, causal_mask, padding_mask
from app.attention.mechanisms import (
    AttentionMechanism,
    MechanismOutput,
    available_mechanisms,
    build_mechanism,
    masked_softmax,
    register_mechanism,
)
from app.attention.multihead import MultiHeadAttention
from app.attention.registry import AttentionConfigError, available_kernels, build_kernel, register_kernel

__all__ = [
    "AttentionCache",
    "AttentionConfigError",
    "AttentionKernel",
    "AttentionMechanism",
    "AttentionOutput",
    "KVCache",
    "KernelCapabilities",
    "MechanismOutput",
    "MultiHeadAttention",
    "StaticCache",
    "attention_mask",
    "available_kernels",
    "available_mechanisms",
    "build_kernel",
    "build_mechanism",
    "causal_mask",
    "masked_softmax",
    "padding_mask",
    "register_kernel",
    "register_mechanism",
]
