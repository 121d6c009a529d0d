"""The rnn family through the real pipeline: train.py's ``train`` -> checkpoint -> translate.py with plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.training import END_TO_END_SLICE, REPO_ROOT, logged_column, run_translate, write_corpus_slice
from hydra import compose, initialize_config_dir

from app.training.task import train

# Short validation and test splits, decoded to at most 40 subwords rather than train.yaml's 256 (an
# 80-step model does not always stop on its own): what is checked (the loss falls, test decoding is
# timed, the checkpoint translates and plots) needs neither more sentences nor longer outputs. The
# training split stays whole: the loss must fall visibly.
SLICE = {**END_TO_END_SLICE, "val": 30, "test_2016_flickr": 20}


@pytest.fixture(scope="module")
def corpus_slice(multi30k_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This module's corpus: the end-to-end slice with the short validation and test splits above."""
    return write_corpus_slice(multi30k_dir, tmp_path_factory.mktemp("m30k-rnn"), SLICE)


@pytest.fixture(scope="module")
def data_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data.cache_dir for both runs: the same corpus and subword settings, so the second run loads
    the tokenizer and the encoded splits the first one made (the attention does not enter them)."""
    return tmp_path_factory.mktemp("rnn-cache")


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["additive", "luong_general"])  # Bahdanau's decoder and Luong's
def test_rnn_trains_scores_and_translates_with_attention_plots(
    attention: str, corpus_slice: Path, data_cache: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    overrides = [
        "model=rnn",
        f"attention={attention}",
        f"data.dir={corpus_slice}",
        "data.fetch=null",
        f"data.cache_dir={data_cache}",
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
        "valid_search.max_len=40",
        "test_search.beam=2",
        "test_search.max_len=40",
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
