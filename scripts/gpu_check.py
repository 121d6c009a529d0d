"""The GPU check in one command (the library: :mod:`app.bench.gpu_check`, whose docstring says what runs).

bash scripts/gpu_check.sh OUTDIR                           # on a lent GPU: under six minutes, one report
python3 scripts/gpu_check.py OUTDIR --device cpu --tiny    # the same steps, tiny, on a CPU
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout without `pip install -e .`

from app.bench.gpu_check import main

if __name__ == "__main__":
    sys.exit(main())
