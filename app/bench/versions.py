"""Before/after decoding speed: two versions of the torch engine, with CTranslate2 float32 in the same run.

``scripts/bench_versions.py`` is the command line. The baseline's files come from ``git archive REF``
into a temporary folder (with :mod:`app.bench.versions_worker` copied in), this checkout is the other
version. Each round starts one process per version, the order alternating, and each process times
greedy and beam 5 at batch 64 and greedy at batch 1 (one call per sentence) on one thread, for the torch
engine and for the CTranslate2 float32 export (the same export for both). The table keeps medians over
rounds (CTranslate2's over every process), speeds relative to CTranslate2, and how many outputs of the
two versions are identical; below it, the lowest and highest after/before ratio of a single round, the
noise a difference must stand out from (each round's seconds are in the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from app.bench.timing import REPO_ROOT
from app.bench.versions_worker import CASES
from app.hardware import cpu_flags, cpu_model

SCRIPT = REPO_ROOT / "scripts" / "bench_versions.py"
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    data_dir = REPO_ROOT / os.environ.get("MULTI30K_DIR", "../shared/data/multi30k")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "checkpoint", nargs="?", help="a Transformer .ckpt (pre-norm, for the CTranslate2 export)"
    )
    parser.add_argument("--baseline", default="HEAD", help="git revision of the version to compare with")
    source = data_dir / "test_2016_flickr.de.gz"
    if not source.is_file():  # the copy committed as a test fixture
        source = REPO_ROOT / "tests" / "fixtures" / "multi30k" / "test_2016_flickr.de.gz"
    parser.add_argument("--source", default=str(source), help="source sentences (default: Multi30k test)")
    parser.add_argument("--limit", type=int, default=1000, help="sentences for the batch-64 cases")
    parser.add_argument("--latency-lines", type=int, default=100, help="sentences for batch 1")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--max-len",
        type=int,
        default=256,
        help="most output subwords (a random model runs to it: fix the work)",
    )
    parser.add_argument("--no-ct2", action="store_true", help="leave CTranslate2 out")
    parser.add_argument(
        "--compile",
        choices=("auto", "on", "aot", "off"),
        default="off",
        help="the torch engine's compiled decoding steps (versions that have them; compile time is "
        "reported apart, as warm-up seconds)",
    )
    parser.add_argument(
        "--baseline-compile",
        choices=("auto", "on", "aot", "off"),
        help="the baseline's compile mode where it differs from --compile (e.g. on against aot)",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--summarize",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="measure nothing: one table row per earlier run's --json (e.g. one per attention kernel)",
    )
    args = parser.parse_args(argv)
    if (args.checkpoint is None) == (args.summarize is None):
        parser.error("give a checkpoint to measure, or --summarize with earlier runs' JSON files")
    return args


def baseline_tree(revision: str, folder: Path) -> Path:
    """The files of ``revision`` under ``folder``, with this checkout's measuring worker copied in."""
    archive = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "archive", revision], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    shutil.copy(REPO_ROOT / "app" / "bench" / "versions_worker.py", folder / "app" / "bench")
    return folder


def measure(tree: Path, args: argparse.Namespace, ct2_dir: str, compile_mode: str) -> dict[str, Any]:
    """One process of the worker with ``app`` from ``tree``: its JSON result."""
    command = [sys.executable, str(SCRIPT), "--worker", str(tree), str(args.checkpoint), args.source]
    command += [str(args.limit), str(args.latency_lines), str(args.max_len), ct2_dir, compile_mode]
    env = {**os.environ, "PYTHONPATH": ""}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every round's processes; the medians and the outputs' agreement."""
    from app.export.ct2 import export_ct2

    seconds: dict[tuple[str, str], list[float]] = {}
    outputs: dict[str, dict[str, list[str]]] = {}
    warmups: dict[str, list[float]] = {}  # untimed warm-up seconds per version (compile time included)
    compiled: dict[str, str | None] = {}  # each version's compile report (None: eager)
    with tempfile.TemporaryDirectory(prefix="bench_versions_") as tmp:
        versions = {"baseline": baseline_tree(args.baseline, Path(tmp)), "checkout": REPO_ROOT}
        ct2_dir = "-"
        if not args.no_ct2:
            ct2_dir = str(export_ct2(args.checkpoint, Path(tmp) / "ct2", quantization="float32"))
        for index in range(args.rounds):
            order = list(versions) if index % 2 == 0 else list(versions)[::-1]
            for version in order:
                modes = {"baseline": args.baseline_compile or args.compile, "checkout": args.compile}
                found = measure(versions[version], args, ct2_dir, modes[version])
                if Path(found.pop("app")).resolve() != (versions[version] / "app").resolve():
                    raise RuntimeError(f"the {version} process imported app from elsewhere")
                compiled[version] = (found.pop("compile", None) or {}).get("report")
                for engine, cases in found.items():
                    name = version if engine.startswith("torch") else engine
                    warmup = cases.pop("warmup", None)
                    if warmup is not None:
                        warmups.setdefault(name, []).append(round(warmup["seconds"], 2))
                    outputs[name] = {case: found["outputs"] for case, found in cases.items()}
                    for case, found in cases.items():
                        seconds.setdefault((name, case), []).append(found["seconds"])
    sentences = {"greedy": args.limit, "beam5": args.limit, "latency": args.latency_lines}
    rows: dict[str, dict[str, float]] = {}
    for (name, case), values in seconds.items():
        median = statistics.median(values)
        rows.setdefault(name, {})[case] = (
            round(1000 * median / sentences[case], 2)
            if case == "latency"
            else round(sentences[case] / median, 1)
        )
    agree = {
        case: round(
            100
            * statistics.mean(
                a == b for a, b in zip(outputs["baseline"][case], outputs["checkout"][case], strict=True)
            ),
            2,
        )
        for case, _, _ in CASES
    }
    flags = sorted(set(FLAGS) & cpu_flags())
    by_round: dict[str, dict[str, list[float]]] = {}
    for (name, case), values in seconds.items():
        by_round.setdefault(name, {})[case] = [round(v, 4) for v in values]
    return {
        "rows": rows,
        "round_seconds": by_round,  # each round's seconds per engine and case, in round order
        "identical_percent": agree,
        "warmup_seconds": warmups,
        "compile": compiled,
        "cpu": cpu_model(),
        "flags": flags,
        "args": vars(args),
    }


def table(result: dict[str, Any]) -> str:
    """Markdown: sentences/s (batch 64), ms per sentence (batch 1), and each against CTranslate2 float32."""
    rows, ct2 = result["rows"], result["rows"].get("ct2-fp32")
    lines = [
        "| engine | greedy sent/s | beam-5 sent/s | batch-1 greedy ms | beam-5 vs CT2 | batch-1 ms vs CT2 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    after = "torch-fp32 after" + (
        f" (compile={result['args']['compile']})" if result["compile"].get("checkout") else ""
    )
    before = f"torch-fp32 before ({result['args']['baseline']}"
    if result["compile"].get("baseline"):
        before += f", compile={result['args'].get('baseline_compile') or result['args']['compile']}"
    labels = {"baseline": before + ")", "checkout": after}
    for name in ("ct2-fp32", "baseline", "checkout"):
        if name not in rows:
            continue
        row = rows[name]
        ratios = ["", ""]
        if ct2:
            ratios = [f"{row['beam5'] / ct2['beam5']:.2f}x", f"{row['latency'] / ct2['latency']:.2f}x"]
        cells = [row["greedy"], row["beam5"], row["latency"], *ratios]
        lines.append(f"| {labels.get(name, name)} | " + " | ".join(map(str, cells)) + " |")
    before, after = rows["baseline"], rows["checkout"]
    speedups = [f"{after[c] / before[c]:.2f}x" for c in ("greedy", "beam5")]
    speedups.append(f"{before['latency'] / after['latency']:.2f}x")
    lines.append("| after / before | " + " | ".join(speedups) + " | | |")
    if spread := round_spread(result.get("round_seconds", {})):
        lines.append(f"\nAfter / before, round by round (their spread is this machine's noise): {spread}.")
    agree = result["identical_percent"]
    flags = ", ".join(result["flags"]) or "no flags read"
    lines.append(
        f"\nOutputs identical before and after: greedy {agree['greedy']}%, beam 5 {agree['beam5']}%, "
        f"batch 1 {agree['latency']}%. CPU: {result['cpu']} ({flags})."
    )
    for version, report in result["compile"].items():
        if report:
            warmup = statistics.median(result["warmup_seconds"][version])
            lines.append(f"{version}: {report}; untimed warm-up {warmup:.1f} s (median over processes).")
    return "\n".join(lines)


def round_spread(by_round: dict[str, dict[str, list[float]]]) -> str:
    """The lowest and highest speed-up of a single round (before's seconds over after's in that round) per
    case, e.g. ``greedy 0.93-1.01x, beam 5 1.02-1.09x, batch 1 0.90-0.99x``; empty below 2 rounds."""
    parts = []
    for case, label in (("greedy", "greedy"), ("beam5", "beam 5"), ("latency", "batch 1")):
        ratios = round_ratios(by_round, case)
        if len(ratios) < 2:
            return ""
        parts.append(f"{label} {min(ratios):.2f}-{max(ratios):.2f}x")
    return ", ".join(parts)


def round_ratios(by_round: dict[str, dict[str, list[float]]], case: str) -> list[float]:
    """Each round's speed-up in ``case``: the baseline's seconds over the checkout's in that round."""
    before, after = (by_round.get(version, {}).get(case, []) for version in ("baseline", "checkout"))
    return [b / a for b, a in zip(before, after, strict=True)]


def summary(results: dict[str, dict[str, Any]]) -> str:
    """Markdown, one row per earlier run (keyed by a label): each case's medians before -> after, the
    speed-up with the lowest and highest single round's in brackets, and identical outputs."""
    lines = [
        "| run | greedy sent/s | speed-up | beam-5 sent/s | speed-up | batch-1 greedy ms | speed-up "
        "| identical outputs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, result in results.items():
        before, after = result["rows"]["baseline"], result["rows"]["checkout"]
        cells = []
        for case in ("greedy", "beam5", "latency"):
            speedup = before[case] / after[case] if case == "latency" else after[case] / before[case]
            ratios = round_ratios(result.get("round_seconds", {}), case)
            spread = f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
            cells += [f"{before[case]} -> {after[case]}", f"{speedup:.2f}x{spread}"]
        agree = result["identical_percent"]
        cells.append(f"{agree['greedy']}% / {agree['beam5']}% / {agree['latency']}%")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    first = next(iter(results.values()))
    lines.append(
        f"\nBefore: {first['args']['baseline']}; speed-ups are after/before (batch 1: before's ms over "
        "after's), in brackets the lowest and highest of single rounds; identical outputs: greedy / beam 5 / "
        f"batch 1. CPU: {first['cpu']} ({', '.join(first['flags']) or 'no flags read'})."
    )
    return "\n".join(lines)


def run_label(result: dict[str, Any], path: Path) -> str:
    """A summary row's name: the folder of the run whose checkpoint was measured (``runs/NAME/checkpoints/
    best.ckpt``), else the JSON file's name."""
    checkpoint = Path(result["args"].get("checkpoint") or "")
    return checkpoint.parents[1].name if checkpoint.parent.name == "checkpoints" else path.stem


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.summarize:
        results = [(path, json.loads(path.read_text())) for path in args.summarize]
        print(summary({run_label(result, path): result for path, result in results}))
        return 0
    result = run(args)
    print(table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 0
