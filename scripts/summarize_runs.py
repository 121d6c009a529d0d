"""A Markdown table of finished runs: the model and attention each used, its test scores and costs.

    python scripts/summarize_runs.py runs/ablation_8min/*          # one row per Hydra run directory
    python scripts/summarize_runs.py docs/results/de_en_small_ablation_4min   # a record: one row per job

Runs without a results.json are listed as unfinished (or failed), never dropped silently. For sweeps
over seeds, ``scripts/report.py`` gives means, confidence intervals and figures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.reports.runs import RunRecord, read_runs
from app.reports.summary import summary_markdown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="Hydra run directories, sweeps or records")
    args = parser.parse_args()
    found: list[tuple[Path, list[RunRecord]]] = [(path, read_runs(path)) for path in args.runs]
    skipped = [str(path) for path, runs in found if not runs]
    if skipped:
        parser.error(f"no runs (no .hydra/config.yaml, no compact record) in: {', '.join(sorted(skipped))}")
    print(summary_markdown([run for _, runs in found for run in runs]))


if __name__ == "__main__":
    main()
