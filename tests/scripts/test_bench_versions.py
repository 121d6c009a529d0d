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
