"""Data pipeline at scale: first preparation, start-up from cache, peak RSS and tokens/s on N pairs.

    python scripts/bench_data.py --pairs 30000 --json
    python scripts/bench_data.py --pairs 3000000 data.num_proc=8 --json
    python scripts/bench_data.py --pairs 300000 trainer=ddp_cpu --json

Any ``train.py`` override works. See :mod:`app.bench.data` for what each figure measures and
docs/bench/data_scale.md for results.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout without `pip install -e .`

from app.bench.data import main

if __name__ == "__main__":
    main()
