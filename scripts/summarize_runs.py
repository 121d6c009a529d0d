"""A Markdown table of finished runs: the model and attention each used, its test scores and costs.

    python scripts/summarize_runs.py runs/ablation_8min/*          # one row per Hydra run directory

Runs without a results.json are listed as unfinished (or failed), never dropped silently. For sweeps
over seeds, ``scripts/report.py`` gives means, confidence intervals and figures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.reports.runs import is_run_dir, read_run
from app.reports.summary import summary_markdown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="Hydra run directories")
    args = parser.parse_args()
    skipped = [str(run) for run in args.runs if not is_run_dir(run)]
    if skipped:
        parser.error(f"not Hydra run directories (no .hydra/config.yaml): {', '.join(sorted(skipped))}")
    print(summary_markdown([read_run(run) for run in args.runs]))


if __name__ == "__main__":
    main()
