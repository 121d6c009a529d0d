"""Choose on validation, then score on test, a run that train.py finished, without training it again.

    python scripts/rescore.py runs/mine                                  # as its config says
    python scripts/rescore.py runs/mine selection.average_last=10 'selection.beam=[4,5,8]' \\
        'selection.alpha=[0.6,1.0]'                                       # a wider choice

The candidates (best.ckpt, the average of the newest step checkpoints) decode the validation set with
every beam size x length penalty asked for; the best by validation BLEU decodes the test set. The run's
results.json gets the new test scores and every validation trial; test.hyp the new translations.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from app.inference.run_scoring import rescore_run  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir", type=Path, help="a run directory written by train.py")
    parser.add_argument("overrides", nargs="*", help="config changes, key=value (selection.*, test_search.*)")
    args = parser.parse_args(argv)
    try:
        results = rescore_run(args.run_dir, args.overrides)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    keys = ("checkpoint", "beam", "alpha", "test_bleu", "test_bleu_lc", "test_bleu_moses_lc", "test_chrf")
    print(json.dumps({k: results.get(k) for k in keys}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
