"""Training throughput, model FLOP utilisation and peak memory of a train.py config (see
:mod:`app.training.benchmark`).

    python scripts/bench_train.py experiment=quickstart --json
    python scripts/bench_train.py experiment=quickstart attention=sdpa --windows 5 --window-steps 30
"""

import sys

from app.training.benchmark import main

if __name__ == "__main__":
    sys.exit(main())
