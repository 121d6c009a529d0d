"""The data-scale benchmark (scripts/bench_data.py) on a tiny corpus: it grows the synthetic corpus,
prepares it in one process and trains from the warm cache in another, and reports every figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.bench import data as bench

TINY = [
    "data.subword.vocab_size=300",
    "data.max_tokens=600",
    "model.d_model=32",
    "model.num_heads=4",
    "model.encoder_layers=1",
    "model.decoder_layers=1",
    "model.d_ff=64",
    "trainer.accelerator=cpu",
    "trainer.precision=32-true",
    "num_threads=1",
]


@pytest.mark.slow
def test_bench_data_prepares_then_trains_from_the_cache(
    multi30k_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--pairs", "3300", "--steps", "4", "--base", str(multi30k_dir), "--work-dir", str(tmp_path)]
    result = bench.main([*args, "--json", *TINY])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == result

    assert result["pairs"] == 3300 == result["train_pairs_kept"] + result["train_pairs_dropped"]
    assert result["steps"] == 4 and result["tokens_per_s"] > 0
    assert result["prep_s"] > 0 and result["startup_s"] > 0
    assert 0 < result["peak_anon_rss_mb"] <= result["peak_rss_mb"]
    assert (result["world_size"], result["num_proc"], result["num_workers"]) == (1, 1, 0)
    assert result["loader_ms_per_batch"] > 0 and result["sentences_per_batch"] >= 1
    assert 0.3 < result["real_token_fraction"] <= 1.0
    # the corpus grew beyond the 3000 fixture pairs, and the prepared cache is on disk
    source_lines = (tmp_path / "synthetic-3300" / "train.src").read_text().splitlines()
    assert len(source_lines) == 3300
    assert any((tmp_path / "cache-3300").iterdir())
