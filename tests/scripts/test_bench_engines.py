"""scripts/bench_engines.py on a tiny Transformer: every case measured each round, BLEU per engine and
beam that matches scoring the engine's own output, the CT2-vs-torch greedy agreement, a markdown table."""

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

from app.acceleration.step import compile_available
from app.bench import engines as bench_engines
from app.inference.engine import SearchSettings
from app.inference.engines import open_engine
from app.inference.metrics import corpus_scores

pytestmark = pytest.mark.usefixtures("single_torch_thread")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_engines.py"
SOURCES = ["Ein Hund läuft.", "Zwei Männer spielen.", "Eine Frau liest ein Buch.", "Kinder lachen.", "Extra."]
REFERENCES = ["A dog runs.", "Two men play.", "A woman reads a book.", "Children laugh.", "Extra."]


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    """``python scripts/bench_engines.py ARGS`` as a user runs it, on one thread."""
    command = [sys.executable, str(SCRIPT), *args]
    return subprocess.run(command, capture_output=True, text=True, env=subprocess_env(), timeout=300)


def tiny_run(checkpoint_factory: Callable[..., torch.nn.Module], tmp_path: Path) -> tuple[Path, Path, Path]:
    """A tiny Transformer's checkpoint, the sources and their references, written under ``tmp_path``."""
    checkpoint = tmp_path / "model.ckpt"
    checkpoint_factory(checkpoint, model_cfg=TINY_TRANSFORMER, attention_cfg={"kernel": "eager"})
    source, reference = tmp_path / "src.de", tmp_path / "ref.en"
    source.write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    reference.write_text("\n".join(REFERENCES) + "\n", encoding="utf-8")
    return checkpoint, source, reference


def test_bench_engines_measures_every_case_with_bleu_and_agreement(
    checkpoint_factory: Callable[..., torch.nn.Module], tmp_path: Path
) -> None:
    checkpoint, source, reference = tiny_run(checkpoint_factory, tmp_path)
    out = tmp_path / "bench.json"
    args = [str(checkpoint), "--source", str(source), "--reference", str(reference), "--limit", "4"]
    args += ["--threads", "1", "--batches", "1", "4", "--beams", "1", "2", "--rounds", "2"]
    args += ["--latency-lines", "2", "--json", str(out)]
    run = run_script(*args)
    assert run.returncode == 0, run.stderr[-4000:]
    table = run.stdout

    result = json.loads(out.read_text())
    rows = result["rows"]
    engines = {"torch-fp32", "torch-bf16", "ct2-fp32", "ct2-int8"}
    assert {(r["engine"], r["batch"], r["beam"]) for r in rows} == {
        (e, b, k) for e in engines for b in (1, 4) for k in (1, 2)
    }
    for row in rows:
        assert row["rounds"] == 2 and row["threads"] == 1
        if row["batch"] == 1:
            assert row["sentences"] == 2 and row["ms_per_sentence"] > 0
        else:
            assert row["sentences"] == 4 and row["sentences_per_s"] > 0 and row["tokens_per_s"] > 0
    torch_greedy = open_engine(checkpoint).translate(SOURCES[:4], SearchSettings(beam=1))
    expected_bleu = round(corpus_scores(torch_greedy, REFERENCES[:4]).bleu, 2)
    assert {r["bleu"] for r in rows if r["engine"] == "torch-fp32" and r["beam"] == 1} == {expected_bleu}
    assert result["ct2_fp32_greedy_equals_torch_percent"] == 100.0  # same model, same greedy search

    assert table.count("| torch-bf16 | 1 |") == 2 and "CT2 float32 greedy == torch float32 greedy" in table
    assert table.startswith(f"Command: `{result['command']}`") and result["cpu_flags"] is not None
    assert all(row["mean_output_length"] > 0 and len(row["round_seconds"]) == 2 for row in rows)


def test_bench_engines_rejects_an_unknown_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        bench_engines.main([str(tmp_path / "x.ckpt"), "--engines", "onnx"])
    assert exited.value.code == 2 and "invalid choice: 'onnx'" in capsys.readouterr().err


def test_bench_engines_compile_needs_the_checkpoint_as_trained(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench_engines.main([str(tmp_path / "x.ckpt"), "--kernels", "eager", "--compile", "aot"]) == 2
    assert "--compile applies to the checkpoint as trained" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(compile_available() is not None, reason="inductor finds no C++ compiler here")
def test_bench_engines_compiles_the_torch_engine_before_timing(
    checkpoint_factory: Callable[..., torch.nn.Module], tmp_path: Path
) -> None:
    checkpoint, source, reference = tiny_run(checkpoint_factory, tmp_path)
    out = tmp_path / "bench.json"
    args = [str(checkpoint), "--source", str(source), "--reference", str(reference), "--limit", "4"]
    args += ["--engines", "torch-fp32", "--threads", "1", "--batches", "1", "--beams", "1"]
    args += ["--rounds", "1", "--compile", "aot", "--json", str(out)]
    run = run_script(*args)
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["config"]["compile"] == "aot"
    assert result["compile_report"].startswith("decoding compiled ahead of time: 3 package(s)")
    assert "Torch engines, compile=aot: decoding compiled ahead of time" in run.stdout
    assert {(r["batch"], r["beam"]) for r in result["rows"]} == {(1, 1)}
