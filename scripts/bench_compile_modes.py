"""What each ``translate.py --compile`` mode gives a user, one-time costs included (the library:
:mod:`app.bench.compile_modes`; results in docs/bench/decoding.md).

    python scripts/bench_compile_modes.py CKPT --rounds 2 --json docs/bench/compile_modes.json
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout without `pip install -e .`

from app.bench.compile_modes import main, worker

if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        checkpoint, mode, source, latency, batch = sys.argv[2:7]
        print(json.dumps(worker(checkpoint, mode, source, int(latency), int(batch))))
        sys.exit(0)
    sys.exit(main())
