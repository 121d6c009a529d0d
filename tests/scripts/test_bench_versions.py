"""scripts/bench_versions.py on a tiny Transformer: two versions (here both HEAD's code) in alternating
processes, CTranslate2 float32 beside them, medians, identical outputs, a markdown table."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers.models import TINY_TRANSFORMER
from helpers.training import subprocess_env

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_versions.py"
SOURCES = ["Ein Hund läuft.", "Zwei Männer spielen.", "Eine Frau liest ein Buch.", "Kinder lachen."]


@pytest.mark.slow
def test_bench_versions_compares_two_trees_with_ct2(
    checkpoint_factory: Callable[..., torch.nn.Module], tmp_path: Path
) -> None:
    checkpoint = tmp_path / "model.ckpt"
    checkpoint_factory(checkpoint, model_cfg=TINY_TRANSFORMER, attention_cfg={"kernel": "eager"})
    source = tmp_path / "src.de"
    source.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    out = tmp_path / "versions.json"
    args = [str(checkpoint), "--baseline", "HEAD", "--source", str(source), "--limit", "4", "--rounds", "2"]
    args += ["--latency-lines", "2", "--max-len", "8", "--json", str(out)]
    command = [sys.executable, str(SCRIPT), *args]
    run = subprocess.run(command, capture_output=True, text=True, env=subprocess_env(), timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(out.read_text())
    assert set(result["rows"]) == {"baseline", "checkout", "ct2-fp32"}
    for row in result["rows"].values():
        assert row["greedy"] > 0 and row["beam5"] > 0 and row["latency"] > 0
    assert result["identical_percent"] == {"greedy": 100.0, "beam5": 100.0, "latency": 100.0}
    assert "| torch-fp32 before (HEAD) |" in run.stdout and "| after / before |" in run.stdout
    assert all(len(result["round_seconds"]["checkout"][case]) == 2 for case in ("greedy", "beam5", "latency"))
    assert "After / before, round by round" in run.stdout


def test_round_spread_pairs_rounds_and_needs_two() -> None:
    from app.bench.versions import round_spread

    by_round = {
        "baseline": {"greedy": [2.0, 2.2], "beam5": [4.0, 4.0], "latency": [1.0, 0.9]},
        "checkout": {"greedy": [2.0, 2.0], "beam5": [3.2, 3.8], "latency": [1.0, 1.0]},
    }
    assert round_spread(by_round) == "greedy 1.00-1.10x, beam 5 1.05-1.25x, batch 1 0.90-1.00x"
    assert round_spread({k: {c: v[:1] for c, v in d.items()} for k, d in by_round.items()}) == ""


def result_of(checkpoint: str, before: float, after: float) -> dict:
    """A --json result as bench_versions writes it, every case taking ``before`` and ``after`` seconds."""
    rows = {case: value for case, value in (("greedy", 100.0), ("beam5", 30.0), ("latency", 50.0))}
    scale = {"baseline": before, "checkout": after}
    return {
        "rows": {
            version: {c: v * (1 / s if c != "latency" else s) for c, v in rows.items()}
            for version, s in scale.items()
        },
        "round_seconds": {  # the baseline's second round 20% slower
            version: {c: [s, s * (1.2 if version == "baseline" else 1.0)] for c in rows}
            for version, s in scale.items()
        },
        "identical_percent": {"greedy": 100.0, "beam5": 99.5, "latency": 100.0},
        "cpu": "Test CPU",
        "flags": ["avx2"],
        "args": {"baseline": "abc1234", "checkpoint": checkpoint},
    }


def test_summarize_prints_one_row_per_run_named_by_its_folder(tmp_path: Path) -> None:
    paths = []
    for name, after in (("attention=eager", 0.5), ("attention=lsh", 1.0)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(result_of(f"runs/{name}/checkpoints/best.ckpt", 1.0, after)))
        paths.append(str(path))
    command = [sys.executable, str(SCRIPT), "--summarize", *paths]
    run = subprocess.run(command, capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert run.returncode == 0, run.stderr[-4000:]
    rows = [line for line in run.stdout.splitlines() if line.startswith("| attention=")]
    assert len(rows) == 2
    assert "| 100.0 -> 200.0 | 2.00x (2.00-2.40) |" in rows[0]  # rounds: 1.0 / 0.5 and 1.2 / 0.5
    assert "| 50.0 -> 25.0 | 2.00x" in rows[0] and "100.0% / 99.5% / 100.0%" in rows[0]
    assert "| 1.00x (1.00-1.20) |" in rows[1]
    assert "Before: abc1234" in run.stdout and "CPU: Test CPU (avx2)" in run.stdout


def test_a_checkpoint_or_summarize_is_required() -> None:
    run = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=subprocess_env())
    assert run.returncode == 2 and "give a checkpoint to measure, or --summarize" in run.stderr
