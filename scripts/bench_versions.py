"""Torch decoding speed of two versions of the code side by side, with CTranslate2 float32 in the same run
(the library: :mod:`app.bench.versions`; results in docs/bench/decoding.md).

    python scripts/bench_versions.py CKPT --baseline HEAD~3 --rounds 3 --limit 256 --latency-lines 50

Each round runs one process per version (the baseline's files from ``git archive``, this checkout's),
the order alternating; each process times greedy and beam 5 at batch 64 and greedy at batch 1 on one
thread, for the torch engine and for the CTranslate2 float32 export. The table keeps medians.
"""

import sys
from pathlib import Path

if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    # A measuring process: ``app`` comes from the tree named on the command line (either version).
    sys.path.insert(0, sys.argv[2])
    from app.bench.versions_worker import main as worker_main

    sys.exit(worker_main(sys.argv[3:]))

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout without `pip install -e .`

from app.bench.versions import main

if __name__ == "__main__":
    sys.exit(main())
