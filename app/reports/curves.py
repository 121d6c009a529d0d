"""Validation BLEU against training steps and wall-clock minutes, and training loss, one line per run.

``metric`` picks the logged BLEU: ``bleu`` (cased) or ``bleu_lc`` (lowercased, for case-folded recipes,
whose cased BLEU means nothing), the same names as ``selection.metric``.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from app.reports.figures import save_png
from app.reports.runs import Run, bleu_against_minutes, series

BLEU_LABELS = {"bleu": "validation BLEU (greedy, cased)", "bleu_lc": "validation BLEU (greedy, lowercased)"}


def curves_figure(runs: list[Run], metric: str = "bleu") -> Figure:
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


def plot_curves(runs: list[Run], output: Path, metric: str = "bleu") -> Path:
    save_png(curves_figure(runs, metric), output)
    return output
