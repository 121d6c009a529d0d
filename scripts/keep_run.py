"""Copy a finished run (or a whole sweep) into a small record for docs/ (library: :mod:`app.reports.record`).

    python scripts/keep_run.py runs/ml6 docs/results/multi6_tiny_lc-cosine_4400steps
    python scripts/keep_run.py runs/ml6 docs/results/X --extra zeroshot.de-fr.hyp   # gzipped alike
    python scripts/keep_run.py runs/ablation_length docs/ablation/length_10min      # a sweep directory

Keeps the config and command line, results.json, metrics and test translations (gzipped) and the log
(its first 30 and last 50 lines when longer); never checkpoints. An existing record is not overwritten.
A sweep directory (job directories inside, no config of its own) keeps every job so, failed ones with
their FAILED file, and the sweep's report, figures and measurement caches: `scripts/report.py RECORD`
then rebuilds the report without checkpoints.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout without `pip install -e .`

from app.reports.record import RecordError, keep_run, keep_sweep
from app.reports.runs import is_run_dir


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a finished run directory (holds results.json), or a sweep's")
    parser.add_argument("record", type=Path, help="the record to write, e.g. docs/results/<name>")
    parser.add_argument("--extra", nargs="*", default=[], help="more files of a run to keep, gzipped")
    args = parser.parse_args()
    if args.extra and not is_run_dir(args.run):
        parser.error("--extra names more files of a run; a sweep directory keeps its jobs' usual files")
    try:
        if is_run_dir(args.run):
            written = keep_run(args.run, args.record, extra=args.extra)
        else:
            written = keep_sweep(args.run, args.record)
    except RecordError as err:
        print(f"keep_run: {err}", file=sys.stderr)
        return 2
    print("\n".join(f"{args.record / path}" for path in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
