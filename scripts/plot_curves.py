"""Plot validation BLEU against training steps and wall-clock minutes, and training loss, for runs.

    python scripts/plot_curves.py runs/m30k_transformer_de_en runs/m30k_transformer_en_de \
        -o docs/figures/multi30k_transformer_curves.png

Minutes come from the ``time/elapsed_min`` metric that training logs with every validation. Runs made
before that metric existed may carry a ``wallclock.csv`` (rows ``unix_time,[epoch,]step`` sampled
while training); their minutes are read from it. Runs with neither are left out of the minutes panel.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np


def read_metrics(run_dir: Path) -> list[dict[str, float]]:
    """Rows of ``<run>/csv/metrics.csv`` with the numeric cells only."""
    with (run_dir / "csv" / "metrics.csv").open() as handle:
        return [
            {k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(handle)
        ]


def series(rows: list[dict[str, float]], x: str, y: str) -> tuple[list[float], list[float]]:
    points = [(row[x], row[y]) for row in rows if x in row and y in row]
    return [p[0] for p in points], [p[1] for p in points]


def minutes_from_wallclock(run_dir: Path, steps: list[float]) -> list[float] | None:
    """Minutes since the first sample at which each step was reached, interpolated from ``wallclock.csv``."""
    path = run_dir / "wallclock.csv"
    if not path.is_file():
        return None
    samples = [(int(row[0]), int(row[-1])) for row in csv.reader(path.open()) if row and row[-1].strip()]
    if not samples:
        return None
    start = samples[0][0]
    # training only moves forward: a later sample with a smaller step (e.g. the test-results row that a
    # sampler read after training) is not a point of the curve
    samples = [sample for i, sample in enumerate(samples) if all(sample[1] >= s for _, s in samples[:i])]
    times = [(t - start) / 60 for t, _ in samples]
    return [float(m) for m in np.interp(steps, [s for _, s in samples], times)]


def bleu_against_minutes(run_dir: Path, rows: list[dict[str, float]]) -> tuple[list[float], list[float]]:
    minutes, bleu = series(rows, "time/elapsed_min", "val/bleu")
    if minutes:
        return minutes, bleu
    steps, bleu = series(rows, "step", "val/bleu")
    return (minutes_from_wallclock(run_dir, steps) or []), bleu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="Hydra run directories")
    parser.add_argument("-o", "--output", type=Path, required=True, help="PNG file to write")
    args = parser.parse_args()
    fig, (ax_steps, ax_minutes, ax_loss) = plt.subplots(1, 3, figsize=(15, 4))
    for index, run in enumerate(args.runs):
        rows = read_metrics(run)
        color = f"C{index % 10}"  # one colour per run in every panel, even where a run has no minutes
        ax_steps.plot(*series(rows, "step", "val/bleu"), marker="o", label=run.name, color=color)
        minutes, bleu = bleu_against_minutes(run, rows)
        if minutes:
            ax_minutes.plot(minutes, bleu, marker="o", label=run.name, color=color)
        ax_loss.plot(*series(rows, "step", "train/nll"), label=run.name, color=color)
    bleu_label = "validation BLEU (greedy, cased)"
    ax_steps.set(xlabel="training step", ylabel=bleu_label, title="BLEU by step")
    ax_minutes.set(xlabel="wall-clock minutes", ylabel=bleu_label, title="BLEU by time")
    ax_loss.set(xlabel="training step", ylabel="training NLL (nats/token)", title="Training loss")
    for ax in (ax_steps, ax_minutes, ax_loss):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
