"""Average the weights of the last N checkpoints of a run into one checkpoint translate.py can read.

    python scripts/average_checkpoints.py runs/mine/checkpoints --last 5 -o runs/mine/checkpoints/avg5.ckpt
    python scripts/average_checkpoints.py a.ckpt b.ckpt c.ckpt -o avg.ckpt

Given a directory, the candidates are its ``step-<step>.ckpt`` files (written with
``checkpoint.every_n_steps=N checkpoint.keep_last=K``), newest last by step number.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from app.checkpoint import CheckpointError, average_checkpoints, save_atomically

_STEP_FILE = re.compile(r"step-(\d+)\.ckpt$")


def step_checkpoints(directory: Path) -> list[Path]:
    """The ``step-<step>.ckpt`` files in ``directory``, oldest first."""
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _STEP_FILE.search(p.name))]
    return [path for _, path in sorted(found)]


def select(inputs: list[Path], last: int | None) -> list[Path]:
    """Explicit files as given, or the newest ``last`` step checkpoints of a directory."""
    if len(inputs) == 1 and inputs[0].is_dir():
        paths = step_checkpoints(inputs[0])
        if not paths:
            raise CheckpointError(f"no step-<step>.ckpt in {inputs[0]} (train with checkpoint.keep_last>0)")
    else:
        paths = inputs
    if last is not None:
        if last < 1:
            raise ValueError(f"--last must be >= 1, got {last}")
        paths = paths[-last:]
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("inputs", nargs="+", type=Path, help="checkpoint files, or a checkpoints directory")
    parser.add_argument("--last", type=int, default=None, help="average only the newest N checkpoints")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the averaged checkpoint to write")
    args = parser.parse_args(argv)
    try:
        paths = select(args.inputs, args.last)
        save_atomically(average_checkpoints(paths), args.output)
    except (CheckpointError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"averaged {len(paths)} checkpoints into {args.output}: {', '.join(p.name for p in paths)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
