"""Train -> checkpoint -> translate, for real: Lightning, Hydra composition, sentencepiece, sacreBLEU."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import wandb
from helpers.training import END_TO_END_SLICE, REPO_ROOT, logged_column, run_translate
from helpers.wandb_records import logged_history
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from app.inference.metrics import corpus_scores
from app.training.task import train


def tiny_run_config(corpus: Path, run_dir: Path, *extra: str) -> DictConfig:
    """A composed train config: a small model on the slice, a few dozen steps."""
    overrides = [
        f"data.dir={corpus}",
        "data.fetch=null",
        f"data.cache_dir={run_dir.parent / 'cache'}",
        "data.subword.vocab_size=1000",
        "data.max_tokens=1500",
        "model.d_model=64",
        "model.num_heads=4",
        "model.encoder_layers=2",
        "model.decoder_layers=2",
        "model.d_ff=128",
        "model.max_positions=64",
        "optim.lr=3e-3",
        "optim.warmup_steps=20",
        "trainer.max_steps=90",
        "trainer.val_check_interval=45",
        "trainer.log_every_n_steps=5",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        # decoded to at most 40 subwords (no reference here is over 27 words): train.yaml's 256 let a model
        # that rarely stops yet (the 10-step wandb run) spend half a minute decoding to the limit
        "valid_search.max_len=40",
        "test_search.beam=2",
        "test_search.max_len=40",
        f"output_dir={run_dir}",
        *extra,
    ]
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=overrides)


@pytest.fixture(scope="module")
def trained_run(corpus_slice: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("runs") / "tiny"
    train(tiny_run_config(corpus_slice, run_dir))
    return run_dir


def test_training_learns_and_writes_results(trained_run: Path, corpus_slice: Path) -> None:
    losses = logged_column(trained_run / "csv" / "metrics.csv", "train/loss")
    assert len(losses) >= 10
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < 0.75 * first, f"training loss did not fall clearly: {first:.2f} -> {last:.2f}"
    assert logged_column(trained_run / "csv" / "metrics.csv", "val/bleu"), "validation BLEU was never logged"
    results = json.loads((trained_run / "results.json").read_text())
    assert results["test_set"] == "test_2016_flickr"
    assert {"test_bleu", "test_bleu_lc", "test_chrf", "parameters", "test_decode_sentences_per_s"} <= set(
        results
    )
    assert results["test_decode_sentences_per_s"] > 0
    assert results["test_bleu_lc"] >= results["test_bleu"] >= 0.0
    assert "tok:13a" in results["test_signature"]
    hypotheses = (trained_run / "test.hyp").read_text(encoding="utf-8").splitlines()
    references = (corpus_slice / "test_2016_flickr.en").read_text().splitlines()
    assert len(hypotheses) == END_TO_END_SLICE["test_2016_flickr"]
    assert corpus_scores(hypotheses, references).rounded()["bleu"] == results["test_bleu"]
    assert sorted(p.name for p in (trained_run / "checkpoints").iterdir()) == ["best.ckpt", "last.ckpt"]


def test_translate_cli_keeps_every_line(trained_run: Path) -> None:
    checkpoint = str(trained_run / "checkpoints" / "best.ckpt")
    long_line = " ".join(["Hund"] * 200).encode()
    lines = [
        b"Ein Mann f\xc3\xa4hrt Fahrrad.",
        b"",
        b"Zwei Hunde \xff\xfe spielen.",
        long_line,
        b"",
        b"Eine Frau.",
    ]
    result = run_translate(checkpoint, "--beam", "3", "--batch-size", "2", stdin=b"\n".join(lines) + b"\n")
    assert result.returncode == 0, result.stderr.decode()
    out = result.stdout.decode("utf-8").split("\n")
    assert out[-1] == "" and len(out) - 1 == len(lines)
    assert [bool(o) for o in out[:-1]] == [bool(line) for line in lines]  # empty in, empty out
    stderr = result.stderr.decode()
    assert "line 3: invalid UTF-8" in stderr
    assert "line 4:" in stderr and "truncated" in stderr


def test_translate_alone_equals_batched(trained_run: Path) -> None:
    """A sentence translates the same padded in a batch with a longer one as decoded on its own
    (``--batch-size 1``: one search per sentence; two runs of translate.py, not one per sentence)."""
    checkpoint = str(trained_run / "checkpoints" / "best.ckpt")
    sentences = ["Ein kleines Mädchen klettert.", "Ein Mann mit einem Hut sitzt auf einer Bank im Park."]
    batched = run_translate(checkpoint, *sentences, "--beam", "2")
    alone = run_translate(checkpoint, *sentences, "--beam", "2", "--batch-size", "1")
    assert batched.returncode == 0 and alone.returncode == 0, (batched.stderr + alone.stderr).decode()
    assert len(batched.stdout.decode().splitlines()) == len(sentences)
    assert batched.stdout == alone.stdout


@pytest.mark.usefixtures("trained_run")
def test_wandb_offline_run_records_metrics(
    corpus_slice: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    run_dir = tmp_path / "wandb-run"
    train(
        tiny_run_config(
            corpus_slice, run_dir, "logger=wandb", "trainer.max_steps=10", "trainer.val_check_interval=10"
        )
    )
    # run.finish() returns before wandb's service has necessarily flushed the record file (seen under
    # load in CI); teardown waits for the service to write everything, as the atexit hook does.
    wandb.teardown()
    run_files = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(run_files) == 1, os.listdir(run_dir)
    history = logged_history(run_files[0])
    logged = {key for row in history for key in row}
    assert {"train/loss", "val/bleu", "val/loss", "test/bleu", "test/chrf"} <= logged
    assert all(row["train/loss"] > 0 for row in history if "train/loss" in row)
