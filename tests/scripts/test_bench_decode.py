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


def test_breakdown_splits_each_beams_time_into_encoder_steps_and_the_rest(
    checkpoint_factory: Callable[..., torch.nn.Module], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = tmp_path / "rnn.ckpt"
    checkpoint_factory(checkpoint, model_cfg=TINY_RNN, attention_cfg=ATTENTIONS["additive"])
    source = tmp_path / "src.de"
    source.write_text("Ein Hund läuft.\nZwei Männer.\nEine Frau liest ein Buch.\n", encoding="utf-8")
    args = [str(checkpoint), "--beams", "1", "3", "--max-len", "6", "--threads", "1", "--source", str(source)]
    assert decoding.main([*args, "--breakdown"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    for row in rows:
        split = row["breakdown"]
        # rows keep milliseconds: the tiny RNN can encode 3 sentences in under 0.5 ms, so 0.0 is a reading
        assert split["encode_s"] >= 0 and split["steps_s"] > 0 and split["rest_s"] >= 0
        assert split["encode_s"] + split["steps_s"] <= split["seconds"]
        assert 1 <= split["steps"] <= 6 * 3  # at most max_len steps per batch (3 sentences: one batch)
    greedy, beam = (row["breakdown"] for row in rows)
    assert greedy["rows"] <= 3 * greedy["steps"] and beam["rows"] > greedy["rows"]


def test_timed_parts_counts_steps_and_rows_and_restores_the_model(
    make_transformer: Callable[..., torch.nn.Module],
) -> None:
    from app.bench.decode_split import timed_parts
    from app.decoding import greedy_search

    model = make_transformer(src_vocab_size=20, tgt_vocab_size=20, seed=1).eval()
    src = torch.randint(4, 20, (3, 5))
    limits = torch.tensor([4, 4, 4])
    with timed_parts(model) as split:
        greedy_search(model, src, bos_id=2, eos_id=3, limits=limits)
    assert split.steps >= 1 and 1 <= split.rows <= 3 * split.steps and split.encode_s > 0
    assert "encode" not in model.__dict__ and "decode_step" not in model.__dict__
