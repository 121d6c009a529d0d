"""Decoding benchmark across engines: torch fp32/bf16, CTranslate2 fp32/int8 (see docs/bench/decoding.md).

    python scripts/bench_engines.py runs/x/checkpoints/best.ckpt --json docs/bench/decoding.json
    python scripts/bench_engines.py CKPT --limit 200 --rounds 1                  # a quick smoke run
    python scripts/bench_engines.py CKPT --engines torch-fp32 ct2-int8 --threads 4 --beams 5

Defaults: test_2016_flickr de->en from Multi30k (``MULTI30K_DIR`` or ../shared/data/multi30k),
threads 1 and 2, batch 1 (latency) and 64 (throughput), greedy and beam 5, 3 rounds, medians.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from app.checkpoint import CheckpointError  # noqa: E402
from app.hardware import cpu_has_fast_bf16, cpu_model  # noqa: E402
from app.inference.benchmark import (  # noqa: E402
    ENGINE_KINDS,
    BenchmarkConfig,
    benchmark,
    markdown_table,
    read_lines,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    data_dir = REPO_ROOT / os.environ.get("MULTI30K_DIR", "../shared/data/multi30k")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a .ckpt written by train.py (Transformer, pre-norm for CT2)")
    parser.add_argument("--source", type=Path, default=data_dir / "test_2016_flickr.de.gz")
    parser.add_argument("--reference", type=Path, default=data_dir / "test_2016_flickr.en.gz")
    parser.add_argument("--engines", nargs="+", default=list(ENGINE_KINDS), choices=ENGINE_KINDS)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64], help="1 = latency")
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 5], help="1 = greedy")
    parser.add_argument("--rounds", type=int, default=3, help="medians over this many rounds")
    parser.add_argument("--limit", type=int, help="only the first N sentences")
    parser.add_argument("--latency-lines", type=int, help="only the first N sentences for batch 1")
    parser.add_argument("--json", type=Path, help="also write the results here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = BenchmarkConfig(
            engines=args.engines,
            threads=args.threads,
            batches=args.batches,
            beams=args.beams,
            rounds=args.rounds,
            latency_lines=args.latency_lines,
        )
        sources = read_lines(args.source, args.limit)
        references = read_lines(args.reference, args.limit) if args.reference.is_file() else None
        result = benchmark(args.checkpoint, sources, references, config)
    except (CheckpointError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    result |= {
        "checkpoint": str(args.checkpoint),
        "source": str(args.source),
        "cpu": cpu_model(),
        "cpu_has_fast_bf16": cpu_has_fast_bf16(),
        "config": vars(config),
    }
    print(markdown_table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
