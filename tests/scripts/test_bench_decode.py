"""scripts/bench_decode.py (app.bench.decoding): sentences/s per beam size, BLEU against references, a JSON
summary; the script once as a user runs it, the rest in-process."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers.rnn import ATTENTIONS, TINY_RNN

from app.bench import decoding

pytestmark = pytest.mark.usefixtures("single_torch_thread")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_decode.py"


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    """``python scripts/bench_decode.py ARGS`` as a user runs it."""
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_bench_decode_reports_each_beam(
    checkpoint_factory: Callable[..., torch.nn.Module], tmp_path: Path
) -> None:
    checkpoint = tmp_path / "rnn.ckpt"
    checkpoint_factory(checkpoint, model_cfg=TINY_RNN, attention_cfg=ATTENTIONS["additive"])
    source, reference = tmp_path / "src.de", tmp_path / "ref.en"
    source.write_text("Ein Hund läuft.\nZwei Männer.\nEine Frau liest ein Buch.\n", encoding="utf-8")
    reference.write_text("A dog runs.\nTwo men.\nA woman reads a book.\n", encoding="utf-8")
    out = tmp_path / "bench.json"
    args = [str(checkpoint), "--beams", "1", "3", "--max-len", "10", "--threads", "1"]
    args += ["--source", str(source), "--reference", str(reference), "--limit", "2", "--json", str(out)]
    completed = bench(*args)
    assert completed.returncode == 0, completed.stderr
    summary = json.loads(out.read_text())
    assert summary["model"] == "rnn" and summary["threads"] == 1
    assert [r["beam"] for r in summary["results"]] == [1, 3]
    for row in summary["results"]:
        assert row["sentences"] == 2 and row["sentences_per_s"] > 0 and row["tokens_per_s"] > 0
        assert "bleu" in row
    assert len(completed.stdout.strip().splitlines()) == 2


def test_bench_decode_without_a_source_is_a_clear_error(
    checkpoint_factory: Callable[..., torch.nn.Module], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = tmp_path / "rnn.ckpt"
    checkpoint_factory(checkpoint, model_cfg=TINY_RNN, attention_cfg=ATTENTIONS["additive"])
    assert decoding.main([str(checkpoint)]) == 2  # the factory's config names no test files
    assert "pass --source" in capsys.readouterr().err
