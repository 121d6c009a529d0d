"""The rnn family through the real pipeline: train.py's ``train`` -> checkpoint -> translate.py with plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.training import REPO_ROOT, logged_column, run_translate
from hydra import compose, initialize_config_dir

from app.training.task import train


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["additive", "luong_general"])
def test_rnn_trains_scores_and_translates_with_attention_plots(
    attention: str, corpus_slice: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    overrides = [
        "model=rnn",
        f"attention={attention}",
        f"data.dir={corpus_slice}",
        "data.fetch=null",
        f"data.cache_dir={tmp_path / 'cache'}",
        "data.subword.vocab_size=1000",
        "data.max_tokens=1500",
        "model.embedding_size=64",
        "model.encoder_hidden_size=64",
        "model.decoder_hidden_size=128",
        "optim.lr=3e-3",
        "optim.warmup_steps=20",
        "trainer.max_steps=80",
        "trainer.val_check_interval=40",
        "trainer.log_every_n_steps=5",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        "test_search.beam=2",
        "num_threads=1",
        f"output_dir={run_dir}",
    ]
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        train(compose("train", overrides=overrides))
    losses = logged_column(run_dir / "csv" / "metrics.csv", "train/loss")
    assert sum(losses[-3:]) / 3 < 0.75 * sum(losses[:3]) / 3
    results = json.loads((run_dir / "results.json").read_text())
    assert results["test_decode_sentences_per_s"] > 0 and results["parameters"] > 0
    plots = tmp_path / "plots"
    checkpoint = str(run_dir / "checkpoints" / "best.ckpt")
    result = run_translate(checkpoint, "Ein Hund.", "", "Zwei Männer.", "--plot-attention", str(plots))
    assert result.returncode == 0, result.stderr.decode()
    assert len(result.stdout.decode().split("\n")) == 4
    assert sorted(p.name for p in plots.iterdir()) == ["line_000001.png", "line_000003.png"]
