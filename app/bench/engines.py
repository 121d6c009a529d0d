"""Decoding speed and quality of one checkpoint across engines, threads, batch sizes and beams, and with
``--kernels``, across attention kernels.

Engines (:mod:`app.bench.engine_set`): our PyTorch model in float32 and under bfloat16 autocast, and its
CTranslate2 export in float32 and int8 (exported to a temporary directory). Every measured *case* is
(kernel, engine, threads, batch, beam): batch 1 measures latency (one call per sentence, ms/sentence), a
larger batch measures throughput (sentences/s and target subwords/s); every case also reports the mean
output length. Rounds visit every case in turn, the (kernel, engine) order rotating each round so none
always runs first (or on a warmer cache); the report keeps each case's median.

With ``--kernels`` (:mod:`app.bench.engine_kernels`) each name is an attention config of
``conf/attention`` (no names: every registered kernel); the checkpoint's model is rebuilt with it, or
``--checkpoint-for NAME=CKPT`` decodes a checkpoint trained with it. CTranslate2 rows appear only for
attention it can represent (full softmax: eager, sdpa, flash); what could not run is named with why.

    python scripts/bench_engines.py runs/x/checkpoints/best.ckpt --json docs/bench/decoding.json
    python scripts/bench_engines.py CKPT --limit 200 --rounds 1                  # a quick smoke run
    python scripts/bench_engines.py CKPT --engines torch-fp32 ct2-int8 --threads 4 --beams 5
    python scripts/bench_engines.py CKPT --kernels eager sdpa sparse linear lsh --threads 1 \\
        --checkpoint-for sparse=runs/sparse/checkpoints/best.ckpt     # one trained per kernel: fair

Defaults: test_2016_flickr de->en from Multi30k (``MULTI30K_DIR`` or ../shared/data/multi30k),
threads 1 and 2, batch 1 (latency) and 64 (throughput), greedy and beam 5, 3 rounds, medians.

``scripts/bench_engines.py`` is the command line; docs/bench/decoding.md has the results.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shlex
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from app.acceleration.auto import COMPILE_MODES
from app.attention.registry import available_kernels
from app.bench.decoding import read_lines
from app.bench.engine_kernels import KernelVariant, open_kernel_engines
from app.bench.engine_report import report
from app.bench.engine_set import ENGINE_KINDS, EngineKey, open_engines
from app.bench.timing import REPO_ROOT
from app.checkpoint import CheckpointError
from app.hardware import cpu_description, cpu_has_fast_bf16
from app.inference.engine import Engine, SearchSettings
from app.inference.metrics import corpus_scores


@dataclass(frozen=True)
class Case:
    """One measured setting; ``kernel`` is None for the checkpoint as trained (no ``--kernels``)."""

    engine: str
    threads: int
    batch: int
    beam: int
    kernel: str | None = None


@dataclass
class Measurement:
    case: Case
    sentences: int  # translated per round
    seconds: list[float] = field(default_factory=list)  # one per round
    target_tokens: int = 0  # output subwords per round, EOS included (from the last round)
    outputs: list[str] = field(default_factory=list)  # from the last round

    def row(self) -> dict[str, Any]:
        seconds = statistics.median(self.seconds)
        case = {key: value for key, value in vars(self.case).items() if value is not None}
        row: dict[str, Any] = {**case, "sentences": self.sentences, "rounds": len(self.seconds)}
        if self.case.batch == 1:
            row["ms_per_sentence"] = round(1000 * seconds / self.sentences, 2)
        else:
            row["sentences_per_s"] = round(self.sentences / seconds, 1)
            row["tokens_per_s"] = round(self.target_tokens / seconds, 1)
        row["mean_output_length"] = round(self.target_tokens / self.sentences, 2)
        row["round_seconds"] = list(self.seconds)  # the medians above come from these
        return row


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
    kernels: list[str] | None = None  # attention configs (conf/attention) to decode with; None: as trained
    checkpoint_for: dict[str, str] = field(default_factory=dict)  # kernel -> a checkpoint trained with it
    init_missing: bool = False  # time kernels whose parameters the checkpoint lacks with fresh ones
    compile: str = "off"  # the torch engines' decoding steps (translate.py's --compile)

    def __post_init__(self) -> None:
        if self.rounds < 1 or min(self.threads + self.batches + self.beams) < 1:
            raise ValueError(
                f"rounds ({self.rounds}), threads ({self.threads}), batches ({self.batches}) and "
                f"beams ({self.beams}) must all be >= 1"
            )
        if self.kernels is None and (self.checkpoint_for or self.init_missing):
            raise ValueError("--checkpoint-for and --init-missing need --kernels")
        if self.kernels is not None and self.compile != "off":
            raise ValueError("--compile applies to the checkpoint as trained: not with --kernels")


Variant = tuple[str | None, str]  # (kernel, engine kind)


def round_cases(
    config: BenchmarkConfig, round_index: int, variants: list[Variant] | None = None
) -> Iterator[Case]:
    """The cases of one round, (kernel, engine) variants innermost so each setting compares them back to
    back; their order rotates by one each round. ``variants`` default to the engines, kernel None."""
    variants = variants if variants is not None else [(None, kind) for kind in config.engines]
    shift = round_index % len(variants) if variants else 0
    order = variants[shift:] + variants[:shift]
    for threads in config.threads:
        for batch in config.batches:
            for beam in config.beams:
                for kernel, kind in order:
                    yield Case(kind, threads, batch, beam, kernel)


@contextmanager
def open_bench_engines(
    checkpoint: str | Path, config: BenchmarkConfig
) -> Iterator[tuple[dict[EngineKey, Engine], dict[str, KernelVariant]]]:
    """The engines to measure, keyed (kernel, kind, threads), and what each ``--kernels`` name became."""
    if config.kernels is None:
        with open_engines(checkpoint, config.engines, config.threads, compile=config.compile) as engines:
            yield engines, {}
        return
    with open_kernel_engines(
        checkpoint,
        config.kernels,
        config.engines,
        config.threads,
        checkpoint_for=config.checkpoint_for,
        init_missing=config.init_missing,
    ) as found:
        yield found


def benchmark(
    checkpoint: str | Path,
    sources: list[str],
    references: list[str] | None,
    config: BenchmarkConfig,
) -> dict[str, Any]:
    """Every case measured ``config.rounds`` times; medians, BLEU per (kernel, engine, beam), and how
    often CTranslate2 float32 greedy matches torch float32 greedy exactly."""
    measurements: dict[Case, Measurement] = {}
    with open_bench_engines(checkpoint, config) as (engines, kernels):
        variants = list(dict.fromkeys((kernel, kind) for kernel, kind, _ in engines))
        for engine in engines.values():
            warm_up(engine, sources, config)
        for round_index in range(config.rounds if variants else 0):
            for case in round_cases(config, round_index, variants):
                lines = sources[: config.latency_lines] if case.batch == 1 else sources
                engine = engines[case.kernel, case.engine, case.threads]
                seconds, outputs = run_case(engine, case, lines, config.length_penalty)
                found = measurements.setdefault(case, Measurement(case, len(lines)))
                found.seconds.append(seconds)
                found.outputs = outputs
                found.target_tokens = sum(len(ids) + 1 for ids in engine.tgt_tokenizer.encode(outputs))
    found = summarize(measurements, sources, references, config, kernels)
    reports = {getattr(engine, "compile_report", lambda: None)() for engine in engines.values()}
    return found | {"compile_report": next((r for r in reports if r), None)}


def warm_up(engine: Engine, sources: list[str], config: BenchmarkConfig) -> None:
    """Untimed runs of every (batch, beam) case on a few sentences: allocators, thread pools, lazy
    initialization, and with ``--compile`` every graph and package the timed cases will use."""
    for batch in config.batches:
        for beam in config.beams:
            settings = SearchSettings(beam=beam, batch_size=batch)
            groups = [[line] for line in sources[:2]] if batch == 1 else [sources[:16]]
            for group in groups:
                engine.translate(group, settings)


def summarize(
    measurements: dict[Case, Measurement],
    sources: list[str],
    references: list[str] | None,
    config: BenchmarkConfig,
    kernels: dict[str, KernelVariant] | None = None,
) -> dict[str, Any]:
    """Rows with medians, BLEU of each (kernel, engine, beam) on the full-batch outputs, greedy agreement
    (per kernel with ``--kernels``, beside what each kernel name became)."""
    full = {
        (m.case.kernel, m.case.engine, m.case.beam): m.outputs
        for m in measurements.values()
        if m.case.batch == max(config.batches) and len(m.outputs) == len(sources)
    }
    bleu = {}
    if references is not None:
        bleu = {key: round(corpus_scores(out, references).bleu, 2) for key, out in full.items()}
    rows = []
    for m in measurements.values():
        row = m.row()
        row["bleu"] = bleu.get((m.case.kernel, m.case.engine, m.case.beam))
        rows.append(row)
    agreement = {}
    for kernel in {key[0] for key in full}:
        if (kernel, "torch-fp32", 1) in full and (kernel, "ct2-fp32", 1) in full:
            pairs = list(zip(full[kernel, "torch-fp32", 1], full[kernel, "ct2-fp32", 1], strict=True))
            agreement[kernel] = round(100 * sum(a == b for a, b in pairs) / len(pairs), 2)
    result = {
        "sentences": len(sources),
        "rows": rows,
        "ct2_fp32_greedy_equals_torch_percent": agreement.get(None),
    }
    if config.kernels is not None:
        result["kernels"] = {
            name: {**asdict(variant), "ct2_fp32_greedy_equals_torch_percent": agreement.get(name)}
            for name, variant in (kernels or {}).items()
        }
    return result


def checkpoint_for(text: str) -> tuple[str, str]:
    """``NAME=CKPT`` from the command line."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(
            f"expected NAME=CKPT (e.g. sparse=runs/sparse/best.ckpt), got {text!r}"
        )
    return name, path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line: a checkpoint, the sentences, and the engines, kernels and settings to compare."""
    data_dir = REPO_ROOT / os.environ.get("MULTI30K_DIR", "../shared/data/multi30k")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a .ckpt written by train.py (Transformer, pre-norm for CT2)")
    parser.add_argument("--source", type=Path, default=data_dir / "test_2016_flickr.de.gz")
    parser.add_argument("--reference", type=Path, default=data_dir / "test_2016_flickr.en.gz")
    parser.add_argument("--engines", nargs="+", default=list(ENGINE_KINDS), choices=ENGINE_KINDS)
    parser.add_argument(
        "--kernels",
        nargs="*",
        metavar="NAME",
        help=f"attention configs of conf/attention to decode with (none: {' '.join(available_kernels())})",
    )
    parser.add_argument(
        "--checkpoint-for",
        nargs="+",
        type=checkpoint_for,
        default=[],
        metavar="NAME=CKPT",
        help="decode kernel NAME with CKPT as trained instead of the checkpoint's weights swapped under it",
    )
    parser.add_argument(
        "--init-missing",
        action="store_true",
        help="time kernels with parameters the checkpoint lacks (linformer's) with fresh ones, not skip them",
    )
    parser.add_argument(
        "--compile",
        choices=COMPILE_MODES,
        default="off",
        help="compile the torch engines' decoding steps as translate.py --compile does (compile time stays "
        "in an untimed warm-up of every case)",
    )
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64], help="1 = latency")
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 5], help="1 = greedy")
    parser.add_argument("--rounds", type=int, default=3, help="medians over this many rounds")
    parser.add_argument("--limit", type=int, help="only the first N sentences")
    parser.add_argument("--latency-lines", type=int, help="only the first N sentences for batch 1")
    parser.add_argument("--json", type=Path, help="also write the results here")
    return parser.parse_args(argv)


def ct2_version() -> str | None:
    try:
        return importlib.metadata.version("ctranslate2")
    except importlib.metadata.PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    """Measure every case, print the Markdown report, and write the whole result with ``--json``."""
    args = parse_args(argv)
    command = shlex.join(["python", "scripts/bench_engines.py", *(sys.argv[1:] if argv is None else argv)])
    try:
        config = BenchmarkConfig(
            engines=args.engines,
            threads=args.threads,
            batches=args.batches,
            beams=args.beams,
            rounds=args.rounds,
            latency_lines=args.latency_lines,
            kernels=(args.kernels or available_kernels()) if args.kernels is not None else None,
            checkpoint_for=dict(args.checkpoint_for),
            init_missing=args.init_missing,
            compile=args.compile,
        )
        sources = read_lines(args.source, args.limit)
        references = read_lines(args.reference, args.limit) if args.reference.is_file() else None
        result = benchmark(args.checkpoint, sources, references, config)
    except (CheckpointError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    cpu = cpu_description()
    result |= {
        "command": command,
        "checkpoint": str(args.checkpoint),
        "source": str(args.source),
        "cpu": cpu["cpu_model"],
        "cpu_flags": cpu["cpu_flags"],
        "cpu_has_fast_bf16": cpu_has_fast_bf16(),
        "torch": torch.__version__,
        "ctranslate2": ct2_version(),
        "config": vars(config),
    }
    print(report(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0
