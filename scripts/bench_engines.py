"""Decoding benchmark across engines: torch fp32/bf16, CTranslate2 fp32/int8 (the library:
:mod:`app.bench.engines`; results in docs/bench/decoding.md).

    python scripts/bench_engines.py runs/x/checkpoints/best.ckpt --json docs/bench/decoding.json
    python scripts/bench_engines.py CKPT --limit 200 --rounds 1                  # a quick smoke run
    python scripts/bench_engines.py CKPT --engines torch-fp32 ct2-int8 --threads 4 --beams 5
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout without `pip install -e .`

from app.bench.engines import main

if __name__ == "__main__":
    sys.exit(main())
