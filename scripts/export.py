"""Export a checkpoint for another inference runtime.

    python scripts/export.py runs/x/checkpoints/best.ckpt --format ct2 -o exports/x_ct2
    python scripts/export.py CKPT --format ct2 -o exports/x_int8 --quantization int8

The directory is self-contained (weights, vocabularies, sentencepiece models): ``translate.py DIR``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.checkpoint import CheckpointError
from app.export.ct2 import QUANTIZATIONS, export_ct2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a .ckpt written by train.py")
    parser.add_argument("--format", choices=("ct2",), default="ct2", help="target runtime (CTranslate2)")
    parser.add_argument("-o", "--output", required=True, help="new directory for the exported model")
    parser.add_argument("--quantization", choices=QUANTIZATIONS, default="float32", help="weight type")
    args = parser.parse_args(argv)
    try:
        path = export_ct2(args.checkpoint, args.output, quantization=args.quantization)
    except (CheckpointError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {path} ({args.quantization}); translate with: python translate.py {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
