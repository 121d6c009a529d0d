"""The GPU check's report (:mod:`app.bench.gpu_check`): what the steps left in the work directory, read
into one JSON object and one Markdown page.

Every figure comes from the product that measured it: tokens/s, target tokens/s, achieved TFLOP/s (model
FLOPs per second), MFU and ``warmup_s`` from ``scripts/bench_train.py``'s JSON lines, times from
``scripts/bench_attention.py``'s CSV, BLEU from train.py's ``results.json``, test counts from pytest's
JUnit XML. Here they are only put side by side: a kernel's tokens/s as a multiple of eager's at the same
batch size and layout (the issue's targets are such ratios), compile's as a multiple of eager mode's.
"""

from __future__ import annotations

import csv
import json
import shlex
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.bench.gpu_markdown import log_text, markdown
from app.io import atomic_write

if TYPE_CHECKING:
    from app.bench.gpu_plan import Outcome, Settings

ROW_FIELDS = (
    "tokens_per_s",
    "target_tokens_per_s",
    "model_tflops",
    "mfu",
    "mfu_bf16",
    "peak_bf16_tflops",
    "peak_cuda_mb",
    "real_token_fraction",
    "warmup_s",
    "error",
)
KEYS = {
    "attention": "attention",
    "data.layout": "layout",
    "data.max_tokens": "max_tokens",
    "data.concat": "concat",
}
SHORT_TRAIN = (
    "test_bleu",
    "test_bleu_lc",
    "test_chrf",
    "global_step",
    "fit_seconds",
    "train_tokens_per_s",
    "test_decode_sentences_per_s",
    "parameters",
)


def bench_rows(paths: list[Path], baseline: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """bench_train.py's JSON lines from ``paths``, each cut to the figures the report shows and its
    varying choices; ``x_eager`` against the eager row of the same shape among these rows, or among
    ``baseline``'s (compile's rows against eager mode's)."""
    rows = []
    for path in filter(Path.is_file, paths):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                result = json.loads(line)
                chosen = dict(o.split("=", 1) for o in result["overrides"] if "=" in o)
                row = {short: chosen[key] for key, short in KEYS.items() if key in chosen}
                rows.append(row | {k: result[k] for k in ROW_FIELDS if k in result})
    for row in rows:  # the ratio: each kernel against eager at the same size and layout
        pool = rows if baseline is None else baseline
        eager = [
            r for r in pool if r.get("attention") == "eager" and _same_shape(r, row) and "tokens_per_s" in r
        ]
        if eager and "tokens_per_s" in row:
            row["x_eager"] = round(row["tokens_per_s"] / eager[0]["tokens_per_s"], 3)
    return rows


def _same_shape(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Same batch size, layout (padded where unnamed) and pairs per example."""
    return all(
        a.get(k, d) == b.get(k, d) for k, d in (("layout", "padded"), ("max_tokens", None), ("concat", None))
    )


def attention_rows(path: Path) -> list[dict[str, Any]]:
    """The forward+backward rows of bench_attention.py's CSV, each with its time as a multiple of sdpa's."""
    if not path.is_file():
        return []
    with path.open(newline="", encoding="utf-8") as handle:
        rows = [r for r in csv.DictReader(handle) if r["bench"] == "train"]
    keep = [{k: r[k] for k in ("variant", "length", "mode", "time_ms", "peak_bytes", "status")} for r in rows]
    sdpa = {r["length"]: float(r["time_ms"]) for r in keep if r["variant"] == "sdpa" and r["time_ms"]}
    for row in keep:
        if row["time_ms"] and row["length"] in sdpa:
            row["x_sdpa_time"] = round(float(row["time_ms"]) / sdpa[row["length"]], 3)
    return keep


def test_counts(path: Path) -> dict[str, Any]:
    """pytest's JUnit XML: passed, failed, errors, skipped, and each failure's test and first line."""
    if not path.is_file():
        return {}
    root = ET.parse(path).getroot()
    cases = list(root.iter("testcase"))
    failures = []
    for case in cases:
        for bad in (*case.findall("failure"), *case.findall("error")):
            message = (bad.get("message") or bad.text or "").strip().splitlines()
            failures.append(
                {
                    "test": f"{case.get('classname')}::{case.get('name')}",
                    "message": message[0][:300] if message else "",
                }
            )
    skipped = sum(1 for case in cases if case.find("skipped") is not None)
    return {
        "tests": len(cases),
        "failed": len(failures),
        "skipped": skipped,
        "passed": len(cases) - len(failures) - skipped,
        "failures": failures,
    }


def short_train(path: Path) -> dict[str, Any]:
    """The short training's results.json: BLEU, steps, time, speed."""
    if not path.is_file():
        return {}
    results = json.loads(path.read_text(encoding="utf-8"))
    return {key: results[key] for key in SHORT_TRAIN if key in results}


def rerun_command(outcomes: list[Outcome], argv: list[str]) -> str | None:
    """The command that runs again what did not finish well (failed, timed out, not run)."""
    names = [o.name for o in outcomes if o.status != "ok"]
    if not names:
        return None
    kept, skip = [], False
    for arg in argv[1:]:  # OUTDIR first, then options; --only's names are replaced
        skip = arg == "--only" or (skip and not arg.startswith("--"))
        kept += [] if skip else [arg]
    return shlex.join(["bash", "scripts/gpu_check.sh", "$OUT", *kept, "--only", *names]).replace(
        "'$OUT'", "$OUT"
    )


def assemble(
    outcomes: list[Outcome], settings: Settings, elapsed: float, budget_s: float, argv: list[str]
) -> dict[str, Any]:
    """Everything the check found, as one JSON-ready object."""
    work = settings.work

    def outputs(kind: str) -> list[Path]:
        return [work / o.output for o in outcomes if o.kind == kind and o.output]

    env = json.loads((work / "env.json").read_text(encoding="utf-8")) if (work / "env.json").is_file() else {}
    return {
        "check": {
            "device": settings.device,
            "tiny": settings.tiny,
            "budget_s": budget_s,
            "seconds": round(elapsed, 1),
            "argv": argv,
            "work": str(work),
        },
        "environment": env,
        "steps": [vars(o) for o in outcomes],
        "tests": test_counts(work / "tests.xml"),
        "train": (train := bench_rows(outputs("train"))),
        "compile": bench_rows(outputs("compile"), baseline=train),
        "attention": attention_rows(work / "attention.csv"),
        "short_train": short_train(work / "short_train" / "results.json"),
        "length": bench_rows(outputs("length")),
        "rerun": rerun_command(outcomes, argv),
    }


def write_report(
    out: Path,
    outcomes: list[Outcome],
    settings: Settings,
    *,
    elapsed: float,
    budget_s: float,
    argv: list[str],
) -> dict[str, Any]:
    """report.json, report.md and log.txt into ``out``, each written atomically."""
    report = assemble(outcomes, settings, elapsed, budget_s, argv)
    for name, text in (
        ("report.json", json.dumps(report, indent=1) + "\n"),
        ("report.md", markdown(report)),
        ("log.txt", log_text(settings.work / "logs", outcomes)),
    ):
        with atomic_write(out / name, "w", encoding="utf-8") as handle:
            handle.write(text)
    return report
