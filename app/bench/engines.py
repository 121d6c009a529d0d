"""Decoding speed and quality of one checkpoint across engines, threads, batch sizes and beams.

Engines: our PyTorch model in float32 and under bfloat16 autocast, and its CTranslate2 export in float32
and int8 (exported to a temporary directory). Every measured *case* is (engine, threads, batch, beam):
batch 1 measures latency (one call per sentence, ms/sentence), a larger batch measures throughput
(sentences/s and target subwords/s). Rounds visit every case in turn, the engine order rotating each
round so no engine always runs first (or on a warmer cache); the report keeps each case's median.

    python scripts/bench_engines.py runs/x/checkpoints/best.ckpt --json docs/bench/decoding.json
    python scripts/bench_engines.py CKPT --limit 200 --rounds 1                  # a quick smoke run
    python scripts/bench_engines.py CKPT --engines torch-fp32 ct2-int8 --threads 4 --beams 5

Defaults: test_2016_flickr de->en from Multi30k (``MULTI30K_DIR`` or ../shared/data/multi30k),
threads 1 and 2, batch 1 (latency) and 64 (throughput), greedy and beam 5, 3 rounds, medians.

``scripts/bench_engines.py`` is the command line; docs/bench/decoding.md has the results.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from app.bench.decoding import read_lines
from app.bench.timing import REPO_ROOT
from app.checkpoint import CheckpointError
from app.data.tokenizer import Tokenizer
from app.export.ct2 import export_ct2
from app.hardware import cpu_has_fast_bf16, cpu_model
from app.inference.engine import Engine, SearchSettings, Translation, Truncated
from app.inference.engines import CT2Engine, open_engine
from app.inference.metrics import corpus_scores

ENGINE_KINDS = ("torch-fp32", "torch-bf16", "ct2-fp32", "ct2-int8")
CT2_QUANTIZATION = {"ct2-fp32": "float32", "ct2-int8": "int8"}


class AutocastEngine(Engine):
    """A torch engine run under bfloat16 autocast: matrix products in bf16, softmax, norms and the
    search's log-probabilities stay float32 (``model.to(bfloat16)`` would round those too)."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.name = "torch-bf16"
        self.source = inner.source
        self.max_source_tokens = inner.max_source_tokens
        self.tgt_tokenizer = inner.tgt_tokenizer

    @property
    def device(self) -> torch.device:
        return self.inner.device

    def translate_nbest(
        self,
        sentences: list[str],
        settings: SearchSettings,
        on_truncate: Truncated | None = None,
        *,
        details: bool = False,
    ) -> list[list[Translation]]:
        device = self.inner.device.type
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            return self.inner.translate_nbest(sentences, settings, on_truncate, details=details)


@dataclass(frozen=True)
class Case:
    """One measured setting."""

    engine: str
    threads: int
    batch: int
    beam: int


@dataclass
class Measurement:
    case: Case
    sentences: int  # translated per round
    seconds: list[float] = field(default_factory=list)  # one per round
    target_tokens: int = 0  # output subwords per round (from the last round)
    outputs: list[str] = field(default_factory=list)  # from the last round

    def row(self) -> dict[str, Any]:
        seconds = statistics.median(self.seconds)
        row: dict[str, Any] = {**vars(self.case), "sentences": self.sentences, "rounds": len(self.seconds)}
        if self.case.batch == 1:
            row["ms_per_sentence"] = round(1000 * seconds / self.sentences, 2)
        else:
            row["sentences_per_s"] = round(self.sentences / seconds, 1)
            row["tokens_per_s"] = round(self.target_tokens / seconds, 1)
        return row


@contextmanager
def open_engines(
    checkpoint: str | Path, kinds: list[str], threads: list[int]
) -> Iterator[tuple[dict[tuple[str, int], Engine], Tokenizer]]:
    """An engine per (kind, threads), and the target tokenizer (to count output subwords alike for
    every engine); CTranslate2 exports live in a temporary directory meanwhile.

    Torch engines are shared across thread counts (``run_case`` sets torch's pool before each run);
    CTranslate2 fixes its threads when loading, so it gets one translator per thread count."""
    unknown = sorted(set(kinds) - set(ENGINE_KINDS))
    if unknown:
        raise ValueError(f"unknown engine {', '.join(unknown)}; choose from {', '.join(ENGINE_KINDS)}")
    torch_engine = open_engine(checkpoint, engine="torch")
    engines: dict[tuple[str, int], Engine] = {}
    with tempfile.TemporaryDirectory(prefix="bench_decoding_") as tmp:
        for kind in kinds:
            if kind in CT2_QUANTIZATION:
                exported = export_ct2(checkpoint, Path(tmp) / kind, quantization=CT2_QUANTIZATION[kind])
            for count in threads:
                if kind == "torch-fp32":
                    engines[kind, count] = torch_engine
                elif kind == "torch-bf16":
                    engines[kind, count] = AutocastEngine(torch_engine)
                else:
                    engines[kind, count] = CT2Engine(exported, threads=count)
        yield engines, torch_engine.tgt_tokenizer


def run_case(engine: Engine, case: Case, sentences: list[str], beam_alpha: float) -> tuple[float, list[str]]:
    """Seconds to translate ``sentences`` as ``case`` says, and the translations."""
    if case.engine.startswith("torch"):
        torch.set_num_threads(case.threads)
    settings = SearchSettings(beam=case.beam, alpha=beam_alpha, batch_size=case.batch)
    started = time.perf_counter()
    if case.batch == 1:  # latency: what one caller with one sentence waits
        outputs = [engine.translate([sentence], settings)[0] for sentence in sentences]
    else:
        outputs = engine.translate(sentences, settings)
    return time.perf_counter() - started, outputs


@dataclass
class BenchmarkConfig:
    engines: list[str]
    threads: list[int]
    batches: list[int]
    beams: list[int]
    rounds: int = 3
    latency_lines: int | None = None  # sentences for batch 1 (all when None)
    length_penalty: float = 0.6

    def __post_init__(self) -> None:
        if self.rounds < 1 or min(self.threads + self.batches + self.beams) < 1:
            raise ValueError(
                f"rounds ({self.rounds}), threads ({self.threads}), batches ({self.batches}) and "
                f"beams ({self.beams}) must all be >= 1"
            )


def round_cases(config: BenchmarkConfig, round_index: int) -> Iterator[Case]:
    """The cases of one round, engines innermost so each setting compares them back to back; the
    engine order rotates by one each round."""
    shift = round_index % len(config.engines)
    order = config.engines[shift:] + config.engines[:shift]
    for threads in config.threads:
        for batch in config.batches:
            for beam in config.beams:
                for kind in order:
                    yield Case(kind, threads, batch, beam)


def benchmark(
    checkpoint: str | Path,
    sources: list[str],
    references: list[str] | None,
    config: BenchmarkConfig,
) -> dict[str, Any]:
    """Every case measured ``config.rounds`` times; medians, BLEU per (engine, beam), and how often
    CTranslate2 float32 greedy matches torch float32 greedy exactly."""
    measurements: dict[Case, Measurement] = {}
    with open_engines(checkpoint, config.engines, config.threads) as (engines, tgt_tokenizer):
        for engine in engines.values():  # warm-up: allocators, thread pools, lazy initialization
            for beam in config.beams:
                engine.translate(sources[:4], SearchSettings(beam=beam))
        for round_index in range(config.rounds):
            for case in round_cases(config, round_index):
                lines = sources[: config.latency_lines] if case.batch == 1 else sources
                seconds, outputs = run_case(
                    engines[case.engine, case.threads], case, lines, config.length_penalty
                )
                found = measurements.setdefault(case, Measurement(case, len(lines)))
                found.seconds.append(seconds)
                found.outputs = outputs
                found.target_tokens = sum(len(ids) + 1 for ids in tgt_tokenizer.encode(outputs))  # + EOS
    return summarize(measurements, sources, references, config)


def summarize(
    measurements: dict[Case, Measurement],
    sources: list[str],
    references: list[str] | None,
    config: BenchmarkConfig,
) -> dict[str, Any]:
    """Rows with medians, BLEU of each (engine, beam) on the full-batch outputs, greedy agreement."""
    full = {
        (m.case.engine, m.case.beam): m.outputs
        for m in measurements.values()
        if m.case.batch == max(config.batches) and len(m.outputs) == len(sources)
    }
    bleu = {}
    if references is not None:
        bleu = {key: round(corpus_scores(out, references).bleu, 2) for key, out in full.items()}
    rows = []
    for m in measurements.values():
        row = m.row()
        row["bleu"] = bleu.get((m.case.engine, m.case.beam))
        rows.append(row)
    agreement = None
    if ("torch-fp32", 1) in full and ("ct2-fp32", 1) in full:
        pairs = list(zip(full["torch-fp32", 1], full["ct2-fp32", 1], strict=True))
        agreement = round(100 * sum(a == b for a, b in pairs) / len(pairs), 2)
    return {"sentences": len(sources), "rows": rows, "ct2_fp32_greedy_equals_torch_percent": agreement}


def speed_table(result: dict[str, Any]) -> str:
    """One line per (engine, threads, beam): batch-1 latency beside full-batch throughput, and BLEU."""
    merged: dict[tuple[str, int, int], dict[str, Any]] = {}
    for row in result["rows"]:
        merged.setdefault((row["engine"], row["threads"], row["beam"]), {}).update(row)
    lines = [
        "| engine | threads | beam | batch 1 ms/sent | batch N sent/s | batch N tok/s | BLEU |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for (engine, threads, beam), row in sorted(merged.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        cells = [row.get(key, "") for key in ("ms_per_sentence", "sentences_per_s", "tokens_per_s", "bleu")]
        lines.append(
            f"| {engine} | {threads} | {beam} | "
            + " | ".join(map(str, ["" if c is None else c for c in cells]))
            + " |"
        )
    agreement = result["ct2_fp32_greedy_equals_torch_percent"]
    if agreement is not None:
        lines.append(f"\nCT2 float32 greedy == torch float32 greedy on {agreement}% of lines.")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line: a checkpoint, the sentences, and the engines and settings to compare."""
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
    """Measure every case, print the Markdown table, and write the whole result with ``--json``."""
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
    print(speed_table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0
