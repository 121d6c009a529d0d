"""The wheels the GPU check needs on the lent GPU machine, into .whl/ (the library:
:mod:`app.bench.gpu_bundle`, whose docstring says what and why).

    python scripts/gpu_bundle.py             # = make gpu-bundle
    python scripts/gpu_bundle.py --dry-run   # what it covers and the sizes, nothing fetched
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout without `pip install -e .`

from app.bench.gpu_bundle import main

if __name__ == "__main__":
    sys.exit(main())
