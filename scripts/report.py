"""The ablation report of one or more sweep directories: report.md, report.html, report.csv, report.json.

    python scripts/report.py multirun/ablation/2025-01-01_12-00-00
    python scripts/report.py SWEEP_A SWEEP_B --baseline "sdpa kv=2" --out docs/results/ablation
    python scripts/report.py SCRATCH_SWEEP FT_SWEEP --decode-limit 256 --beams 1 --rounds 1   # two arms

See docs/ablation.md and :mod:`app.reports.report`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.reports.report import write_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweeps", nargs="+", type=Path, help="Hydra sweep directories (or run directories)")
    parser.add_argument("--baseline", help="the variant others are compared with (default: the MHA one)")
    parser.add_argument("--out", type=Path, help="where the report goes (default: the first sweep dir)")
    parser.add_argument(
        "--decode-limit",
        type=int,
        help="time decoding on the first N test sentence pairs only (ceil(N/K) examples of K joined pairs; "
        "0: all; default: the sweep's report setting, else all)",
    )
    parser.add_argument(
        "--beams", type=int, nargs="+", help="beam sizes to time (default: the sweep's setting, else 1 5)"
    )
    parser.add_argument(
        "--rounds", type=int, help="timing rounds, median reported (default: the sweep's, else 3)"
    )
    parser.add_argument("--remeasure", action="store_true", help="time decoding again, ignoring the cache")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    try:
        paths = write_report(
            args.sweeps,
            args.out,
            baseline=args.baseline,
            decode_limit=args.decode_limit,
            beams=tuple(args.beams) if args.beams else None,
            rounds=args.rounds,
            remeasure=args.remeasure,
        )
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print("\n".join(f"wrote {path}" for path in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
