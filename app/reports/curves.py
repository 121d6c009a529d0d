"""Validation BLEU against training steps and wall-clock minutes, and training loss, one line per run."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from app.reports.figures import save_png
from app.reports.runs import Run, bleu_against_minutes, series

BLEU_LABEL = "validation BLEU (greedy, cased)"


def curves_figure(runs: list[Run]) -> Figure:
    """Three panels: BLEU by step, BLEU by minute (runs with timing only), training NLL by step."""
    fig, (ax_steps, ax_minutes, ax_loss) = plt.subplots(1, 3, figsize=(15, 4))
    for index, run in enumerate(runs):
        color = f"C{index % 10}"  # one colour per run in every panel, even where a run has no minutes
        ax_steps.plot(*series(run.metrics, "step", "val/bleu"), marker="o", label=run.name, color=color)
        minutes, bleu = bleu_against_minutes(run.path, run.metrics)
        if minutes:
            ax_minutes.plot(minutes, bleu, marker="o", label=run.name, color=color)
        ax_loss.plot(*series(run.metrics, "step", "train/nll"), label=run.name, color=color)
    ax_steps.set(xlabel="training step", ylabel=BLEU_LABEL, title="BLEU by step")
    ax_minutes.set(xlabel="wall-clock minutes", ylabel=BLEU_LABEL, title="BLEU by time")
    ax_loss.set(xlabel="training step", ylabel="training NLL (nats/token)", title="Training loss")
    for ax in (ax_steps, ax_minutes, ax_loss):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    return fig


def plot_curves(runs: list[Run], output: Path) -> Path:
    save_png(curves_figure(runs), output)
    return output
