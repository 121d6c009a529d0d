"""A decoding step's operations timed apart: Linear weight layouts, single-query attention, oneDNN for the
wide linears, beam candidates (the library: :mod:`app.bench.step_ops`; results in docs/bench/decoding.md).

    python scripts/bench_step_ops.py
    python scripts/bench_step_ops.py --d-model 512 --layers 6 --vocab 32000 --rows 1 5 64
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout without `pip install -e .`

from app.bench.step_ops import main

if __name__ == "__main__":
    sys.exit(main())
