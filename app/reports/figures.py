"""The reports' figures: learning curves of runs, the ablation's seed bands and trade-offs, PNG bytes.

Output is byte-stable: the same data always gives the same PNG bytes (no timestamps, no software version
in the metadata), so regenerated reports diff cleanly.

``metric`` picks the logged BLEU of :func:`curves_figure`: ``bleu`` (cased) or ``bleu_lc`` (lowercased,
for case-folded recipes, whose cased BLEU means nothing), the same names as ``selection.metric``. The
ablation's attention maps are drawn by :func:`app.inference.plot.comparison_figure`. This module imports
matplotlib, numpy and the run reader only (``scripts/plot_curves.py`` starts in about a second): the
variant types are for annotations.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from PIL import Image

from app.reports.runs import RunRecord, bleu_against_minutes, series

if TYPE_CHECKING:  # annotations only: importing variants would load the data and attention packages
    from app.reports.variants import Group

PNG_METADATA = {"Software": None}  # matplotlib otherwise writes its version; PNGs carry no date
DPI = 110
BLEU_LABELS = {"bleu": "validation BLEU (greedy, cased)", "bleu_lc": "validation BLEU (greedy, lowercased)"}


def png_bytes(fig: Figure) -> bytes:
    """The figure as compact PNG bytes (:func:`compact_png`); the figure is closed."""
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=DPI, metadata=PNG_METADATA)
    finally:
        plt.close(fig)
    return compact_png(buffer.getvalue())


def compact_png(data: bytes) -> bytes:
    """PNG ``data`` re-encoded with a palette of at most 256 colours, no dithering: line plots and heat
    maps look the same at about a third of matplotlib's RGBA size (committed reports stay small).
    Deterministic: the same input gives the same bytes."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    palette = image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    buffer = io.BytesIO()
    palette.save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def save_png(fig: Figure, path: Path) -> bytes:
    """Write the figure to ``path`` (folders created); returns the bytes written."""
    data = png_bytes(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data


def curves_figure(runs: list[RunRecord], metric: str = "bleu") -> Figure:
    """Three panels: BLEU by step, BLEU by minute (runs with timing only), training NLL by step."""
    if metric not in BLEU_LABELS:
        raise ValueError(f"metric={metric!r}; valid choices: {', '.join(BLEU_LABELS)}")
    column, label = f"val/{metric}", BLEU_LABELS[metric]
    fig, (ax_steps, ax_minutes, ax_loss) = plt.subplots(1, 3, figsize=(15, 4))
    for index, run in enumerate(runs):
        color = f"C{index % 10}"  # one colour per run in every panel, even where a run has no minutes
        ax_steps.plot(*series(run.metrics, "step", column), marker="o", label=run.name, color=color)
        minutes, bleu = bleu_against_minutes(run.path, run.metrics, column)
        if minutes:
            ax_minutes.plot(minutes, bleu, marker="o", label=run.name, color=color)
        ax_loss.plot(*series(run.metrics, "step", "train/nll"), label=run.name, color=color)
    ax_steps.set(xlabel="training step", ylabel=label, title="BLEU by step")
    ax_minutes.set(xlabel="wall-clock minutes", ylabel=label, title="BLEU by time")
    ax_loss.set(xlabel="training step", ylabel="training NLL (nats/token)", title="Training loss")
    for ax in (ax_steps, ax_minutes, ax_loss):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    return fig


def plot_curves(runs: list[RunRecord], output: Path, metric: str = "bleu") -> Path:
    """:func:`curves_figure` written to ``output``."""
    save_png(curves_figure(runs, metric), output)
    return output


def band_series(
    runs: list[RunRecord], x_key: str
) -> tuple[list[float], list[float], list[float], list[float]]:
    """Validation BLEU over ``x_key`` across seeds: x values every seed reached, mean, min and max."""
    curves = [series(run.metrics, x_key, "val/bleu") for run in runs]
    curves = [(xs, ys) for xs, ys in curves if xs]
    if not curves:
        return [], [], [], []
    end = min(xs[-1] for xs, _ in curves)
    grid = sorted({x for xs, _ in curves for x in xs if x <= end})
    values = np.array([np.interp(grid, xs, ys) for xs, ys in curves])  # (seeds, points)
    return grid, list(values.mean(0)), list(values.min(0)), list(values.max(0))


def seed_bands_png(group: Group) -> bytes:
    """Validation BLEU by step and by minute, one line (mean over seeds) and band (min to max) per variant."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for index, variant in enumerate(group.variants):
        for ax, key in zip(axes, ("step", "time/elapsed_min"), strict=True):
            grid, mean, low, high = band_series(variant.runs, key)
            if grid:
                ax.plot(grid, mean, color=f"C{index % 10}", label=variant.name)
                ax.fill_between(grid, low, high, color=f"C{index % 10}", alpha=0.2)
    for ax, label in zip(axes, ("training step", "wall-clock minutes"), strict=True):
        ax.set(xlabel=label, ylabel="validation BLEU (greedy)", title=f"BLEU by {label.split()[-1]}")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    return png_bytes(fig)


def tradeoff_png(rows: list[dict[str, Any]], x_key: str, x_label: str) -> bytes:
    """Test BLEU (mean, std error bars) against ``x_key``, one point per variant (report rows)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for index, row in enumerate(rows):
        if row.get(x_key) is None or row["bleu"] is None:
            continue
        ax.errorbar(row[x_key], row["bleu"], yerr=row["bleu_std"] or 0, fmt="o", capsize=3,
                    color=f"C{index % 10}", label=row["variant"])  # fmt: skip
    ax.set(xlabel=x_label, ylabel="test BLEU (cased), mean over seeds")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return png_bytes(fig)


def lengths_png(found: dict[str, list[Any]], metrics: dict[str, tuple[str, bool]]) -> bytes:
    """Each metric against the input length (``data.concat``, log scale), one line per variant.

    ``found`` maps a variant to its :class:`~app.reports.lengths.LengthPoint` s; unfinished points are gaps.
    """
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.8))
    for ax, (key, (label, _)) in zip(axes, metrics.items(), strict=True):
        for index, (name, lengths) in enumerate(found.items()):
            done = [p for p in lengths if p.row is not None and p.row.get(key) is not None]
            xs, ys = [p.length for p in done], [p.row[key] for p in done]
            if xs:
                ax.plot(xs, ys, "o-", color=f"C{index % 10}", label=name)
        ax.set(xscale="log", xlabel="sentence pairs per example (data.concat)", ylabel=label, title=label)
        ax.grid(alpha=0.3)
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=7)
    fig.tight_layout()
    return png_bytes(fig)
