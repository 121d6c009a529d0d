"""Copy a finished run (or a whole sweep) into a small record for docs/ (library: :mod:`app.reports.record`).

    python scripts/keep_run.py runs/ml6 docs/results/multi6_tiny_lc-cosine_4400steps
    python scripts/keep_run.py runs/ml6 docs/results/X --extra zeroshot.de-fr.hyp   # gzipped, beside
    python scripts/keep_run.py runs/ablation_length docs/ablation/length_10min      # a sweep directory
    python scripts/keep_run.py --compact docs/ablation/length_10min                 # pack an older record
    python scripts/keep_run.py --unpack-hyp docs/results/*/      # plain test.hyp files, for sacrebleu -i

Keeps the config and command line, results.json, metrics, test translations and the log (its first 30
and last 50 lines when longer) of every job in two compact files, runs.jsonl.gz and hypotheses.jsonl.gz
(app/reports/layout.py); never checkpoints. An existing record is not overwritten. A sweep directory
(job directories inside, no config of its own) keeps every job so, failed ones with their FAILED file,
and the sweep's report, figures and measurement caches: `scripts/report.py RECORD` then rebuilds the
report without checkpoints. `--compact` packs records written job by job (one directory of files per
job) in place, after checking that the packed files read back the same. `--unpack-hyp` writes each job's
test translations as the run wrote them (<record>/test.hyp or <record>/<job>/test.hyp; git-ignored).
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout without `pip install -e .`

from app.reports.layout import is_compact, unpack_hypotheses
from app.reports.record import RecordError, compact_record, keep_run, keep_sweep
from app.reports.runs import is_run_dir


def keep(args: argparse.Namespace) -> list[Path]:
    """The record of ``args.run`` written to ``args.record``: its files, with the record's path."""
    if is_run_dir(args.run):
        written = keep_run(args.run, args.record, extra=args.extra)
    else:
        written = keep_sweep(args.run, args.record)
    return [args.record / path for path in written]


def unpack(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``--unpack-hyp``: each compact record's test.hyp files, their paths printed."""
    if args.run or args.compact or args.extra:
        parser.error("--unpack-hyp writes the test.hyp files of records; give nothing else with it")
    for record in args.unpack_hyp:
        if not is_compact(record):  # a glob such as docs/results/*/ also names the older records
            print(f"keep_run: {record} is no compact record (no runs.jsonl.gz): skipped", file=sys.stderr)
            continue
        print("\n".join(map(str, unpack_hypotheses(record))))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, nargs="?", help="a finished run directory, or a sweep's")
    parser.add_argument("record", type=Path, nargs="?", help="the record to write, e.g. docs/results/<name>")
    parser.add_argument("--extra", nargs="*", default=[], help="more files of a run to keep, gzipped")
    parser.add_argument(
        "--compact", nargs="+", type=Path, metavar="RECORD", help="pack these records in place instead"
    )
    parser.add_argument(
        "--unpack-hyp", nargs="+", type=Path, metavar="RECORD", help="write these records' test.hyp files"
    )
    args = parser.parse_args()
    if args.unpack_hyp:
        return unpack(parser, args)
    if args.compact and (args.run or args.extra):
        parser.error("--compact packs existing records; give no run, record or --extra with it")
    if not args.compact and not (args.run and args.record):
        parser.error("give a run (or sweep) directory and the record to write, or --compact RECORD ...")
    if args.extra and not is_run_dir(args.run):
        parser.error("--extra names more files of a run; a sweep directory keeps its jobs' usual files")
    try:
        if args.compact:
            written = [record / path for record in args.compact for path in compact_record(record)]
        else:
            written = keep(args)
    except RecordError as err:
        print(f"keep_run: {err}", file=sys.stderr)
        return 2
    print("\n".join(map(str, written)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
