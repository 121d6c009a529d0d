"""Training throughput, model FLOP utilisation and peak memory of a train.py config (the library:
:mod:`app.bench.training`).

    python scripts/bench_train.py experiment=quickstart --json
    python scripts/bench_train.py experiment=quickstart attention=sdpa --windows 5 --window-steps 30
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout without `pip install -e .`

from app.bench.training import main

if __name__ == "__main__":
    sys.exit(main())
