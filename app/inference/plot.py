"""Attention heatmaps: target tokens (rows) against source tokens (columns), one PNG per sentence.

Used by ``translate.py --plot-attention DIR`` and, side by side across variants, by the ablation report.
Matplotlib runs with the file-only Agg backend, so plots work on machines without a display.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.image import AxesImage

from app.inference.engine import AttentionMap

CELL_INCHES = 0.32  # size of one token cell; figures grow with the sentence lengths


def attention_figure(attention: AttentionMap, title: str | None = None) -> Figure:
    """A heatmap of ``attention.weights`` (T, S) labelled with the target and source pieces."""
    rows, cols = check_shape(attention)
    fig = plt.figure(figsize=(max(4.0, 2.0 + CELL_INCHES * cols), max(3.0, 1.5 + CELL_INCHES * rows)))
    ax = fig.add_subplot()
    image = draw_attention(ax, attention, title)
    fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
    fig.tight_layout()
    return fig


def comparison_figure(panels: dict[str, AttentionMap | str], title: str | None = None) -> Figure:
    """One sentence's heatmaps side by side, one panel per label; a string panel is a note drawn in place
    of a map (e.g. ``no weights`` for a kernel that computes none). All panels share the 0..1 scale."""
    maps = [m for m in panels.values() if isinstance(m, AttentionMap)]
    rows = max((len(m.target_tokens) for m in maps), default=4)
    cols = max((len(m.source_tokens) for m in maps), default=4)
    width, height = max(3.0, 1.5 + CELL_INCHES * cols), max(3.0, 1.8 + CELL_INCHES * rows)
    fig, axes = plt.subplots(1, len(panels), figsize=(width * len(panels), height), squeeze=False)
    for ax, (label, panel) in zip(axes[0], panels.items(), strict=True):
        if isinstance(panel, AttentionMap):
            check_shape(panel)
            draw_attention(ax, panel, label)
        else:
            ax.set_title(label, fontsize=9)
            ax.text(0.5, 0.5, panel, ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def check_shape(attention: AttentionMap) -> tuple[int, int]:
    """(rows, cols) of the weights, after checking that they match the token labels."""
    rows, cols = attention.weights.shape
    if (rows, cols) != (len(attention.target_tokens), len(attention.source_tokens)):
        raise ValueError(
            f"weights {tuple(attention.weights.shape)} do not match {len(attention.target_tokens)} target "
            f"and {len(attention.source_tokens)} source tokens"
        )
    return rows, cols


def draw_attention(ax: Axes, attention: AttentionMap, title: str | None = None) -> AxesImage:
    """Draw ``attention.weights`` (T, S) on ``ax``: outputs down, source pieces across, scale 0..1."""
    rows, cols = attention.weights.shape
    image = ax.imshow(
        attention.weights.numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest"
    )
    ax.set_xticks(range(cols), labels=attention.source_tokens, rotation=90, fontsize=8)
    ax.set_yticks(range(rows), labels=attention.target_tokens, fontsize=8)
    ax.set_xlabel("source")
    ax.set_ylabel("output")
    if title:
        ax.set_title(title, fontsize=9)
    return image


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
