"""Name -> kernel class registry. Config files name kernels; this module turns names into objects."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from app.attention.base import AttentionKernel
from app.errors import ConfigError

_KERNELS: dict[str, type[AttentionKernel]] = {}


class AttentionConfigError(ConfigError):
    """An attention choice that cannot work, reported before training starts."""


def register_kernel(name: str) -> Callable[[type[AttentionKernel]], type[AttentionKernel]]:
    """Class decorator: make a kernel selectable as ``attention.kernel=<name>``."""

    def add(cls: type[AttentionKernel]) -> type[AttentionKernel]:
        if name in _KERNELS:
            raise ValueError(f"attention kernel {name!r} is registered twice")
        cls.name = name
        _KERNELS[name] = cls
        return cls

    return add


def available_kernels() -> list[str]:
    """The registered kernel names: the choices of ``attention=<name>`` for Transformers."""
    return sorted(_KERNELS)


def kernel_class(name: str) -> type[AttentionKernel]:
    """The class registered as ``name``; an unknown name is reported with the valid ones."""
    if name not in _KERNELS:
        raise AttentionConfigError(
            f"unknown attention kernel {name!r}; valid choices: {', '.join(available_kernels())}"
        )
    return _KERNELS[name]


def build_kernel(name: str, **options: Any) -> AttentionKernel:
    """Instantiate a registered kernel; unknown options are reported with the valid ones."""
    cls = kernel_class(name)
    try:
        return cls(**options)
    except TypeError as err:
        valid = ", ".join(kernel_options(name)) or "none"
        raise AttentionConfigError(
            f"attention kernel {name!r} rejected options {options}: {err}; its options: {valid} "
            "(besides kernel, num_kv_heads, dropout and sites)"
        ) from err


def kernel_options(name: str) -> list[str]:
    """The option names a kernel's constructor takes."""
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    params = inspect.signature(kernel_class(name).__init__).parameters.values()
    return [p.name for p in params if p.name != "self" and p.kind in named]
