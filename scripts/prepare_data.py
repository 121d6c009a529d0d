#!/usr/bin/env python
"""Prepare Multi30k task-1 text as data/multi30k/{split}.{lang} (decompressed, one sentence per line).

Examples:
    python scripts/prepare_data.py --source ../shared/data/multi30k    # from local .gz files (offline)
    python scripts/prepare_data.py --langs de en                       # download the official files
    python scripts/prepare_data.py --source tests/fixtures/multi30k --any-size   # the small test corpus
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # allow running from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO_ROOT))

from app.data.multi30k import (  # noqa: E402
    EXPECTED_LINES,
    LANGS,
    DownloadError,
    Multi30kError,
    SplitSummary,
    prepare_multi30k,
)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--source", type=Path, default=None, help="directory with {split}.{lang}.gz files")
    parser.add_argument("--out", type=Path, default=Path("data/multi30k"), help="output directory")
    parser.add_argument(
        "--langs", nargs="+", default=list(LANGS), help=f"languages (default: {' '.join(LANGS)})"
    )
    parser.add_argument("--force", action="store_true", help="re-fetch and rewrite existing files")
    parser.add_argument(
        "--any-size",
        action="store_true",
        help="accept splits of any size (a slice of the release), not only the official line counts",
    )
    return parser.parse_args(argv)


def format_summary(summaries: Sequence[SplitSummary]) -> str:
    """A small aligned table: split, lines, files written, files skipped."""
    rows = [("split", "lines", "written", "skipped")]
    rows += [(s.split, str(s.lines), str(s.written), str(s.skipped)) for s in summaries]
    widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]))]
    lines = ("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows)
    return "\n".join(line.rstrip() for line in lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        summaries = prepare_multi30k(
            args.out,
            source=args.source,
            langs=args.langs,
            force=args.force,
            expected_lines=None if args.any_size else EXPECTED_LINES,
        )
    except (Multi30kError, DownloadError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"Multi30k ({', '.join(args.langs)}) in {args.out}:")
    print(format_summary(summaries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
