#!/usr/bin/env python
"""Cut the test fixture corpus (tests/fixtures/multi30k) from a local copy of the Multi30k release.

    python scripts/make_test_fixture.py --source ../shared/data/multi30k

Writes the first lines of every split and language (``app.data.multi30k.FIXTURE_LINES``) as
``{split}.{lang}.gz`` with a time-stamp-free gzip header, so rerunning it reproduces the committed files
byte for byte. The tests read only this fixture, never the full release.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # allow running from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO_ROOT))

from app.data.multi30k import FIXTURE_LINES, Multi30kError, write_slice  # noqa: E402


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--source", type=Path, required=True, help="directory with {split}.{lang}.gz files")
    parser.add_argument(
        "--out", type=Path, default=REPO_ROOT / "tests" / "fixtures" / "multi30k", help="output directory"
    )
    args = parser.parse_args(argv)
    try:
        sizes = write_slice(args.source, args.out, FIXTURE_LINES)
    except Multi30kError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"{len(sizes)} files, {sum(sizes.values()) / 1024:.0f} KiB in {args.out} (lines: {FIXTURE_LINES})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
