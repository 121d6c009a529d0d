"""Benchmark one attention layer per kernel: time and peak memory against sequence length, and KV-cache
decoding (the library: :mod:`app.bench.attention`, whose docstring says what is measured and how).

    python scripts/bench_attention.py --device cpu --threads 2       # docs/bench/attention_cpu.{csv,png}
    python scripts/bench_attention.py --device cuda                  # docs/bench/attention_cuda.{csv,png}
    python scripts/bench_attention.py --device cpu --lengths 64 128 --repeats 1 --decode-lengths 8 16  # smoke
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout without `pip install -e .`

from app.bench.attention import main

if __name__ == "__main__":
    main()
