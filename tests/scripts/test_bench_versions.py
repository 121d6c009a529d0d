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
