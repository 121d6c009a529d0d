"""Plot validation BLEU against training steps and wall-clock minutes, and training loss, for runs.

    python scripts/plot_curves.py docs/results/de_en_small_full_60min docs/results/en_de_small_full_60min \
        -o docs/figures/multi30k_transformer_curves.png
    python scripts/plot_curves.py RUN_A RUN_B --metric bleu_lc -o curves.png   # lowercased validation BLEU

Minutes come from the ``time/elapsed_min`` metric that training logs with every validation, or for older
runs from their ``wallclock.csv`` (see :mod:`app.reports.runs`). The figure: :mod:`app.reports.figures`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.inference.selection import SELECTION_METRICS
from app.reports.figures import plot_curves
from app.reports.runs import RunRecord, read_metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (with csv/metrics.csv)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="PNG file to write")
    parser.add_argument("--metric", choices=SELECTION_METRICS, default="bleu", help="validation BLEU to plot")
    args = parser.parse_args()
    # Only the metrics are needed: older committed runs may lack .hydra/config.yaml.
    runs = [
        RunRecord(path=p, config={}, metrics=read_metrics(p), results=None, log_tail="") for p in args.runs
    ]
    print(f"wrote {plot_curves(runs, args.output, args.metric)}")


if __name__ == "__main__":
    main()
