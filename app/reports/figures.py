"""Byte-stable matplotlib output: the same data always gives the same PNG bytes (no timestamps,
no software version in the metadata), so regenerated reports diff cleanly."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

PNG_METADATA = {"Software": None}  # matplotlib otherwise writes its version; PNGs carry no date
DPI = 110


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG bytes; the figure is closed."""
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=DPI, metadata=PNG_METADATA)
    finally:
        plt.close(fig)
    return buffer.getvalue()


def save_png(fig: Figure, path: Path) -> bytes:
    """Write the figure to ``path`` (folders created); returns the bytes written."""
    data = png_bytes(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data


def data_uri(png: bytes) -> str:
    """A PNG as an ``<img src=...>`` value, for self-contained HTML."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")
