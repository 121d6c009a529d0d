"""Decoding benchmark across engines: torch fp32/bf16, CTranslate2 fp32/int8, and with ``--kernels``
across attention kernels (the library: :mod:`app.bench.engines`; results in docs/bench/decoding.md).

    python scripts/bench_engines.py runs/x/checkpoints/best.ckpt --json docs/bench/decoding.json
    python scripts/bench_engines.py CKPT --limit 200 --rounds 1                  # a quick smoke run
    python scripts/bench_engines.py CKPT --engines torch-fp32 ct2-int8 --threads 4 --beams 5
    python scripts/bench_engines.py CKPT --kernels eager sdpa sparse linear lsh --threads 1
    python scripts/bench_engines.py CKPT --kernels eager sparse --checkpoint-for sparse=SPARSE.ckpt

``--kernels NAME ...`` decodes with each attention config of conf/attention (no names: every registered
kernel): CKPT's model rebuilt with it (its weights *swapped* under the kernel, as the table says), or with
``--checkpoint-for NAME=CKPT`` a checkpoint trained with it, as trained (the fair measurement: swapped
weights change the outputs and their lengths, so every row also gives subwords/s and the mean output
length). CTranslate2 rows only where the export can represent the attention; a kernel that cannot run
(parameters the checkpoint lacks: ``--init-missing`` times it with fresh ones) is a row with the reason.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout without `pip install -e .`

from app.bench.engines import main

if __name__ == "__main__":
    sys.exit(main())
