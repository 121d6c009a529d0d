"""Attention kernels; importing this package registers every built-in kernel."""

from app.attention.kernels import eager, flash, flex, linear, linformer, lsh, sdpa, sparse  # noqa: F401
