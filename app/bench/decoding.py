"""Decoding speed of a checkpoint: sentences per second with greedy and beam search on the test set.

``scripts/bench_decode.py`` is the command line:

    python scripts/bench_decode.py runs/rnn_additive/checkpoints/best.ckpt         # beams 1 and 5
    python scripts/bench_decode.py CKPT --beams 1 5 10 --batch-size 64 --threads 1 --json out.json
    python scripts/bench_decode.py CKPT --source my.de --limit 200                         # another file
    python scripts/bench_decode.py CKPT --beams 5 --threads 1 --breakdown      # encoder / steps / search

The source file defaults to the test split named in the checkpoint's config (``data.files.test.src``,
relative to the repository root). Each setting translates every sentence once after a warm-up batch;
the time covers tokenization, batching, search and detokenization, as ``translate.py`` would spend it
(measured by :func:`app.inference.evaluate.evaluate`, as training's test scores are).
Also printed: the BLEU of each output when the config's reference file exists, so a faster setting
that translates worse is visible. ``--breakdown`` translates once more per setting with the model's
encoder and decoder steps timed apart (:mod:`app.bench.decode_split`): what is left is the search's own
work and the text handling.
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

from app.bench.decode_split import timed_parts
from app.bench.timing import REPO_ROOT
from app.inference.engine import SearchSettings
from app.inference.evaluate import evaluate
from app.inference.torch_engine import TorchEngine, load_torch_engine


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line: a checkpoint, the settings to time and where the sentences come from."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a .ckpt written by train.py")
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 5], help="beam sizes (1 = greedy)")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per search batch")
    parser.add_argument("--length-penalty", type=float, default=0.6, help="GNMT alpha for beam search")
    parser.add_argument("--max-len", type=int, default=256, help="most output subwords per sentence")
    parser.add_argument("--source", type=Path, help="source sentences (default: the config's test split)")
    parser.add_argument("--reference", type=Path, help="references for BLEU (default: the test split)")
    parser.add_argument("--limit", type=int, help="use only the first N sentences")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: PyTorch's choice)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument(
        "--breakdown", action="store_true", help="also time the encoder, decoder steps and search apart"
    )
    return parser.parse_args(argv)


def read_lines(path: str | Path, limit: int | None = None) -> list[str]:
    """Lines of a plain or gzipped UTF-8 file, the first ``limit`` only if given."""
    path = Path(path)
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    lines = raw.decode("utf-8").splitlines()
    return lines[:limit] if limit else lines


def test_files(config: dict[str, Any]) -> tuple[Path | None, Path | None]:
    """The checkpoint config's test source and reference paths (None when the config names none)."""
    files = (config.get("data") or {}).get("files") or {}
    test = files.get("test") or {}
    return tuple(REPO_ROOT / test[side] if test.get(side) else None for side in ("src", "tgt"))


def time_parts(translator: TorchEngine, sentences: list[str], settings: SearchSettings) -> dict:
    """One more translation of ``sentences``, its seconds split into encoder, decoder steps and the rest."""
    with timed_parts(translator.model) as split:
        started = time.perf_counter()
        translator.translate(sentences, settings)
        total = time.perf_counter() - started
    return split.as_row(total)


def main(argv: list[str] | None = None) -> int:
    """Time each beam size over the sentences; one JSON line per setting, a summary with ``--json``."""
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    translator, config = load_torch_engine(args.checkpoint, device=args.device)
    default_src, default_ref = test_files(config)
    source = args.source or default_src
    if source is None or not source.is_file():
        print(f"error: no source file ({source}); pass --source", file=sys.stderr)
        return 2
    sentences = read_lines(source, args.limit)
    reference = args.reference or (default_ref if args.source is None else None)
    references = read_lines(reference, args.limit) if reference and reference.is_file() else None
    results = []
    for beam in args.beams:
        settings = SearchSettings(
            beam=beam, alpha=args.length_penalty, max_len=args.max_len, batch_size=args.batch_size
        )
        evaluation = evaluate(translator, sentences, references, settings, warmup=True)
        speed = evaluation.speed()
        row = {
            "beam": beam,
            **{k: speed[k] for k in ("sentences", "seconds", "sentences_per_s", "tokens_per_s")},
        }
        if evaluation.scores is not None:
            row["bleu"] = round(evaluation.scores.bleu, 2)
        if args.breakdown:
            row["breakdown"] = time_parts(translator, sentences, settings)
        results.append(row)
        print(json.dumps(row))
    summary = {
        "checkpoint": str(args.checkpoint),
        "model": config["model"].get("family"),
        "attention": config["attention"],
        "parameters": sum(p.numel() for p in {id(p): p for p in translator.model.parameters()}.values()),
        "device": args.device,
        "threads": torch.get_num_threads(),
        "batch_size": args.batch_size,
        "cpu": platform.processor() or platform.machine(),
        "results": results,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0
