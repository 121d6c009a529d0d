"""Plot validation BLEU and training loss against wall-clock time and steps for one or more runs.

python scripts/plot_curves.py runs/m30k_de_en runs/m30k_en_de -o docs/figures/learning_curves.png
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def read_metrics(run_dir: Path) -> list[dict[str, float]]:
    """Rows of ``<run>/csv/metrics.csv`` with the numeric cells only."""
    with (run_dir / "csv" / "metrics.csv").open() as handle:
        return [
            {k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(handle)
        ]


def series(rows: list[dict[str, float]], key: str) -> tuple[list[float], list[float]]:
    points = [(row["step"], row[key]) for row in rows if key in row and "step" in row]
    return [p[0] for p in points], [p[1] for p in points]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="Hydra run directories")
    parser.add_argument("-o", "--output", type=Path, required=True, help="PNG file to write")
    args = parser.parse_args()
    fig, (ax_bleu, ax_loss) = plt.subplots(1, 2, figsize=(11, 4))
    for run in args.runs:
        rows = read_metrics(run)
        ax_bleu.plot(*series(rows, "val/bleu"), marker="o", label=run.name)
        ax_loss.plot(*series(rows, "train/nll"), label=run.name)
    ax_bleu.set(xlabel="training step", ylabel="validation BLEU (greedy, cased)", title="Validation BLEU")
    ax_loss.set(xlabel="training step", ylabel="training NLL (nats/token)", title="Training loss")
    for ax in (ax_bleu, ax_loss):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
