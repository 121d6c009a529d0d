"""Average the weights of the last N checkpoints of a run into one checkpoint translate.py can read.

    python scripts/average_checkpoints.py runs/mine/checkpoints --last 5 -o runs/mine/checkpoints/avg5.ckpt
    python scripts/average_checkpoints.py a.ckpt b.ckpt c.ckpt -o avg.ckpt

Given a directory, the candidates are its ``step-<step>.ckpt`` files (written with
``checkpoint.every_n_steps=N checkpoint.keep_last=K``), newest last by step number.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.checkpoint import CheckpointError, average_checkpoints, checkpoints_to_average, save_atomically


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("inputs", nargs="+", type=Path, help="checkpoint files, or a checkpoints directory")
    parser.add_argument("--last", type=int, default=None, help="average only the newest N checkpoints")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the averaged checkpoint to write")
    args = parser.parse_args(argv)
    try:
        paths = checkpoints_to_average(args.inputs, args.last)
        save_atomically(average_checkpoints(paths), args.output)
    except (CheckpointError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"averaged {len(paths)} checkpoints into {args.output}: {', '.join(p.name for p in paths)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
