"""scripts/bench_decode.py: sentences/s per beam size, BLEU against references, a JSON summary."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.test_rnn_model import ATTENTIONS, TINY_RNN

pytestmark = pytest.mark.usefixtures("single_torch_thread")

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_decode.py"


def load_script():
    spec = importlib.util.spec_from_file_location("bench_decode", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_decode_reports_each_beam(
    checkpoint_factory: Callable[..., torch.nn.Module], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = tmp_path / "rnn.ckpt"
    checkpoint_factory(checkpoint, model_cfg=TINY_RNN, attention_cfg=ATTENTIONS["additive"])
    source, reference = tmp_path / "src.de", tmp_path / "ref.en"
    source.write_text("Ein Hund läuft.\nZwei Männer.\nEine Frau liest ein Buch.\n", encoding="utf-8")
    reference.write_text("A dog runs.\nTwo men.\nA woman reads a book.\n", encoding="utf-8")
    out = tmp_path / "bench.json"
    args = [str(checkpoint), "--beams", "1", "3", "--max-len", "10", "--threads", "1"]
    args += ["--source", str(source), "--reference", str(reference), "--limit", "2", "--json", str(out)]
    assert load_script().main(args) == 0
    summary = json.loads(out.read_text())
    assert summary["model"] == "rnn" and summary["threads"] == 1
    assert [r["beam"] for r in summary["results"]] == [1, 3]
    for row in summary["results"]:
        assert row["sentences"] == 2 and row["sentences_per_s"] > 0 and "bleu" in row
    assert len(capsys.readouterr().out.strip().splitlines()) == 2


def test_bench_decode_without_a_source_is_a_clear_error(
    checkpoint_factory: Callable[..., torch.nn.Module], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = tmp_path / "rnn.ckpt"
    checkpoint_factory(checkpoint, model_cfg=TINY_RNN, attention_cfg=ATTENTIONS["additive"])
    assert load_script().main([str(checkpoint)]) == 2  # the factory's config names no test files
    assert "pass --source" in capsys.readouterr().err
