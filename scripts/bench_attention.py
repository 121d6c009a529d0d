"""Benchmark one attention layer per kernel: time and peak memory against sequence length, and KV-cache
decoding (the library: :mod:`app.attention.benchmark`, whose docstring says what is measured and how).

    python scripts/bench_attention.py --device cpu --threads 2       # docs/bench/attention_cpu.{csv,png}
    python scripts/bench_attention.py --device cuda                  # docs/bench/attention_cuda.{csv,png}
    python scripts/bench_attention.py --device cpu --lengths 64 128 --repeats 1 --decode-lengths 8 16  # smoke
"""

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # allow running from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO_ROOT))

from app.attention.benchmark import main  # noqa: E402

if __name__ == "__main__":
    main()
