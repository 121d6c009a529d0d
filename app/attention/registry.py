"""Name -> kernel class registry. Config files name kernels; this module turns names into objects."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.attention.base import AttentionKernel

_KERNELS: dict[str, type[AttentionKernel]] = {}


class AttentionConfigError(ValueError):
    """An attention choice that cannot work, reported before training starts."""


def register_kernel(name: str) -> Callable[[type[AttentionKernel]], type[AttentionKernel]]:
    """Class decorator: make a kernel selectable as ``attention.kernel=<name>``."""

    def add(cls: type[AttentionKernel]) -> type[AttentionKernel]:
        if name in _KERNELS:
            raise ValueError(f"attention kernel {name!r} is registered twice")
        _KERNELS[name] = cls
        return cls

    return add


def available_kernels() -> list[str]:
    return sorted(_KERNELS)


def kernel_class(name: str) -> type[AttentionKernel]:
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
        raise AttentionConfigError(f"attention kernel {name!r} rejected options {options}: {err}") from err
