"""Decoding speed of a checkpoint: sentences per second with greedy and beam search on the test set
(the library: :mod:`app.bench.decoding`).

    python scripts/bench_decode.py runs/rnn_additive/checkpoints/best.ckpt         # beams 1 and 5
    python scripts/bench_decode.py CKPT --beams 1 5 10 --batch-size 64 --threads 1 --json out.json
    python scripts/bench_decode.py CKPT --source my.de --limit 200                         # another file
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout without `pip install -e .`

from app.bench.decoding import main

if __name__ == "__main__":
    sys.exit(main())
