"""What each ``translate.py --compile`` mode gives a user, one-time costs included, in one run.

``scripts/bench_compile_modes.py`` is the command line. Two kinds of figure, every mode in its own
processes, modes alternating within each round so a host's drift falls on all of them:

- **what a user waits for**: the wall clock of ``translate.py CKPT --compile MODE`` as a fresh process, on
  one sentence and on a file (the test set: 1,000 lines), with translate.py's defaults (beam 5, batch 64),
  from start to exit: loading, compiling, packaging or finding packages, translating. ``aot`` runs twice: with
  an empty package cache (the first run on a machine) and with the packages already built (every run
  after it);
- **steady state**: in one process per mode, after an untimed warm-up that pays every one-time cost,
  batch-1 greedy milliseconds per sentence and beam 5 at batch 64 sentences per second.

Medians over rounds, and each mode's ratio to ``off`` (eager) beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from app.bench.timing import REPO_ROOT
from app.hardware import cpu_description

MODES = ("off", "aot", "auto")
TRANSLATE = REPO_ROOT / "translate.py"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a Transformer .ckpt")
    source = REPO_ROOT / "data" / "multi30k" / "test_2016_flickr.de"
    parser.add_argument("--source", default=str(source), help="the file to translate (default: test set)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--latency-lines", type=int, default=40, help="sentences for steady batch-1 greedy")
    parser.add_argument("--batch-lines", type=int, default=256, help="sentences for steady beam 5 batch 64")
    parser.add_argument(
        "--threads", type=int, default=1, help="CPU threads of every process (0: translate.py's default)"
    )
    parser.add_argument(
        "--steady-only", action="store_true", help="only the steady-state workers, one per mode a round"
    )
    parser.add_argument(
        "--warm-cache", help="the package cache of the cached aot runs, kept (default: a temporary one)"
    )
    parser.add_argument("--json", help="also write the figures here")
    return parser.parse_args(argv)


def wall_clock(checkpoint: str, mode: str, args: list[str], cache: Path, threads: int) -> float:
    """Seconds of one fresh ``translate.py`` process, output discarded; a failure raises with its stderr."""
    env = {**os.environ, "ATTN_MT_AOT_CACHE": str(cache)}
    command = [sys.executable, str(TRANSLATE), checkpoint, "--compile", mode, "-o", os.devnull, *args]
    command += ["--threads", str(threads)]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return seconds


def steady_state(
    checkpoint: str, mode: str, source: Path, latency: int, batch: int, cache: Path, threads: int
) -> dict:
    """A worker process's steady-state figures for ``mode`` (see :func:`worker`)."""
    env = {**os.environ, "ATTN_MT_AOT_CACHE": str(cache), "ATTN_MT_BENCH_THREADS": str(threads)}
    script = REPO_ROOT / "scripts" / "bench_compile_modes.py"
    command = [
        sys.executable,
        str(script),
        "--worker",
        checkpoint,
        mode,
        str(source),
        str(latency),
        str(batch),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the {mode} worker failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def worker(checkpoint: str, mode: str, source: str, latency: int, batch: int) -> dict:
    """Load, warm up untimed on the same inputs (compiling, packaging), then time: batch-1 greedy ms per
    sentence and beam 5 batch-64 sentences per second."""
    import torch

    from app.inference.engine import SearchSettings
    from app.inference.torch_engine import load_torch_engine

    if threads := int(os.environ.get("ATTN_MT_BENCH_THREADS", "0")):
        torch.set_num_threads(threads)
    lines = Path(source).read_text(encoding="utf-8").splitlines()
    translator, _ = load_torch_engine(checkpoint, compile=mode)
    greedy, beam = SearchSettings(beam=1, batch_size=1), SearchSettings(beam=5, batch_size=64)
    started = time.perf_counter()
    translator.translate(lines[:2], greedy)
    translator.translate(lines[:batch], beam)
    warm_up = time.perf_counter() - started
    started = time.perf_counter()
    for line in lines[:latency]:
        translator.translate([line], greedy)
    per_sentence = (time.perf_counter() - started) / latency
    started = time.perf_counter()
    translator.translate(lines[:batch], beam)
    rate = batch / (time.perf_counter() - started)
    return {"warm_up_s": warm_up, "greedy_b1_ms": per_sentence * 1e3, "beam5_b64_sent_s": rate}


def run(args: argparse.Namespace) -> dict:
    """Every figure of every round (see the module doc)."""
    source = Path(args.source)
    lines = source.read_text(encoding="utf-8").splitlines()
    with tempfile.TemporaryDirectory() as tmp:
        one = Path(tmp) / "one.txt"
        one.write_text(lines[0] + "\n", encoding="utf-8")
        warm = Path(args.warm_cache) if args.warm_cache else Path(tmp) / "warm-cache"
        cases = {"1 sentence": ["-i", str(one)], f"{len(lines)} lines": ["-i", str(source)]}
        if args.steady_only:
            cases = {}
        variants = [(m, "cold") if m != "off" else (m, "") for m in args.modes if cases or m == "off"]
        variants += [(m, "cached") for m in args.modes if m != "off"]
        if len(variants) > 1:
            for case in cases.values():  # every package the cached runs will look for, built once
                wall_clock(args.checkpoint, "aot", case, warm, args.threads)
        figures: dict[str, dict[str, list[float]]] = {}
        for round_ in range(args.rounds):
            order = variants if round_ % 2 == 0 else variants[::-1]
            for mode, cache in order:
                name = f"{mode} ({cache})" if cache else mode
                for case, case_args in cases.items():
                    folder = warm if cache == "cached" else Path(tempfile.mkdtemp(dir=tmp))
                    seconds = wall_clock(args.checkpoint, mode, case_args, folder, args.threads)
                    figures.setdefault(name, {}).setdefault(case, []).append(seconds)
                    print(f"round {round_ + 1} {name:13s} {case:20s} {seconds:7.2f} s", flush=True)
                if cache != "cold" and mode != "auto":  # auto's steady state is one of the two
                    steady = steady_state(
                        args.checkpoint,
                        mode,
                        source,
                        args.latency_lines,
                        args.batch_lines,
                        warm,
                        args.threads,
                    )
                    for key, value in steady.items():
                        figures.setdefault(name, {}).setdefault(key, []).append(value)
                    print(f"round {round_ + 1} {name:13s} steady {json.dumps(steady)}", flush=True)
    return {"cpu": cpu_description(), "threads": args.threads or "translate.py's default", "figures": figures}


def table(result: dict) -> str:
    """Markdown: one row per figure, one column per mode, medians, and the ratio to ``off``."""
    figures = result["figures"]
    names = list(figures)
    keys = list(next(iter(figures.values())))
    keys += [k for name in names for k in figures[name] if k not in keys]
    rows = ["| figure | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for key in keys:
        base = statistics.median(figures["off"][key]) if key in figures.get("off", {}) else None
        cells = []
        for name in names:
            if key not in figures[name]:
                cells.append("")
                continue
            value = statistics.median(figures[name][key])
            faster = value / base if key == "beam5_b64_sent_s" else (base / value if base else None)
            ratio = f" ({faster:.2f}x)" if base and name != "off" else ""
            cells.append(f"{value:.2f}{ratio}")
        unit = "" if key.endswith(("_ms", "_s")) else " s"
        rows.append(f"| {key}{unit} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print(f"\n{result['cpu']}; (Nx): speed relative to off, higher is faster\n")
    print(table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0
