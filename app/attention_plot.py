"""Attention heatmaps: target tokens (rows) against source tokens (columns), one PNG per sentence.

Used by ``translate.py --plot-attention DIR``. Matplotlib runs with the file-only Agg backend, so
plots work on machines without a display.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from app.translator import AttentionMap

CELL_INCHES = 0.32  # size of one token cell; figures grow with the sentence lengths


def attention_figure(attention: AttentionMap, title: str | None = None) -> Figure:
    """A heatmap of ``attention.weights`` (T, S) labelled with the target and source pieces."""
    weights = attention.weights.numpy()
    rows, cols = weights.shape
    if (rows, cols) != (len(attention.target_tokens), len(attention.source_tokens)):
        raise ValueError(
            f"weights {tuple(weights.shape)} do not match {len(attention.target_tokens)} target and "
            f"{len(attention.source_tokens)} source tokens"
        )
    fig = plt.figure(figsize=(max(4.0, 2.0 + CELL_INCHES * cols), max(3.0, 1.5 + CELL_INCHES * rows)))
    ax = fig.add_subplot()
    image = ax.imshow(weights, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(cols), labels=attention.source_tokens, rotation=90, fontsize=8)
    ax.set_yticks(range(rows), labels=attention.target_tokens, fontsize=8)
    ax.set_xlabel("source")
    ax.set_ylabel("output")
    if title:
        ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
    fig.tight_layout()
    return fig


def save_attention_plot(attention: AttentionMap, path: str | Path, title: str | None = None) -> Path:
    """Write the heatmap of one sentence as a PNG; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = attention_figure(attention, title=title)
    try:
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    return path


def plot_file_name(line_number: int) -> str:
    """The PNG name for input line ``line_number`` (1-based), sortable: ``line_000042.png``."""
    return f"line_{line_number:06d}.png"
