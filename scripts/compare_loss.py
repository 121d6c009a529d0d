"""Compare the training-loss curves of two runs of one config and seed, window by window.

    python scripts/compare_loss.py docs/results/RUN_BEFORE docs/results/RUN_AFTER --until 500 --window 100

Prints a Markdown table: per window of steps, each run's mean logged training loss and their mean
difference (B - A); under it the difference over all compared steps with a 95% bootstrap interval and a
sign-flip permutation p-value. The exit status is 1 when the difference is significant (p < 0.05).
See :mod:`app.reports.loss_match`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.reports.loss_match import compare_losses, loss_comparison_markdown


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_a", type=Path, help="run directory A (the reference; with csv/metrics.csv)")
    parser.add_argument("run_b", type=Path, help="run directory B (the change)")
    parser.add_argument("--until", type=int, default=500, help="compare the steps below this one")
    parser.add_argument("--window", type=int, default=100, help="steps per window")
    args = parser.parse_args()
    result = compare_losses(args.run_a, args.run_b, until=args.until, window=args.window)
    print(loss_comparison_markdown(result, str(args.run_a), str(args.run_b)))
    return 0 if result.p_value >= 0.05 else 1


if __name__ == "__main__":
    sys.exit(main())
