"""After training, validation chooses the checkpoint (best or averaged) and the beam/alpha; test scores
only report. Also: ``scripts/rescore.py`` makes the same choice again on a finished run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.training import END_TO_END_SLICE, REPO_ROOT, compose_train, tiny_overrides, write_corpus_slice

from app.data.corpus import read_parallel
from app.inference.engine import SearchSettings
from app.inference.engines import open_engine
from app.inference.evaluate import evaluate
from app.inference.metrics import corpus_scores
from app.inference.run_scoring import rescore_run
from app.training.task import train

SELECTION = [
    "trainer.max_steps=40",
    "trainer.val_check_interval=20",
    "checkpoint.every_n_steps=10",
    "checkpoint.keep_last=3",
    "selection.average_last=3",
    "selection.beam=[1,2]",
]


# Short validation and test splits: every trial, the re-decodings below and the rescore decode the whole
# validation split (beam 2 included), and a 40-step model runs to max_len on many sentences. What is
# checked (the trial order, the choice of the best BLEU with ties to the first, scores reproduced by
# decoding again, test scores from the chosen decoding) holds on any number of sentences; the training
# split stays whole, for a tokenizer and checkpoints like the end-to-end runs'.
SLICE = {**END_TO_END_SLICE, "val": 40, "test_2016_flickr": 20}


@pytest.fixture(scope="module")
def corpus_slice(multi30k_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This module's corpus: the end-to-end slice with the short validation and test splits above."""
    return write_corpus_slice(multi30k_dir, tmp_path_factory.mktemp("m30k-selection"), SLICE)


@pytest.fixture(scope="module")
def selected_run(corpus_slice: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("selection")
    run_dir = root / "run"
    train(compose_train(tiny_overrides(corpus_slice, run_dir, root / "cache", *SELECTION)))
    return run_dir


def test_validation_chooses_among_best_and_averaged_with_every_beam(selected_run: Path) -> None:
    results = json.loads((selected_run / "results.json").read_text())
    trials = results["selection"]["trials"]
    assert [(Path(t["checkpoint"]).name, t["beam"]) for t in trials] == [
        ("best.ckpt", 1),
        ("best.ckpt", 2),
        ("averaged.ckpt", 1),
        ("averaged.ckpt", 2),
    ]
    chosen = results["selection"]["chosen"]
    assert chosen["bleu"] == max(t["bleu"] for t in trials)
    assert chosen == next(t for t in trials if t["bleu"] == chosen["bleu"]), "a tie goes to the first trial"
    assert (results["checkpoint"], results["beam"]) == (chosen["checkpoint"], chosen["beam"])
    assert (selected_run / "checkpoints" / "averaged.ckpt").is_file()


def test_trials_are_real_validation_decodings(selected_run: Path, corpus_slice: Path) -> None:
    results = json.loads((selected_run / "results.json").read_text())
    valid = read_parallel(corpus_slice / "val.de", corpus_slice / "val.en")
    for trial in results["selection"]["trials"][::3]:  # best.ckpt greedy, averaged.ckpt beam 2
        settings = SearchSettings(beam=trial["beam"], alpha=trial["alpha"], max_len=40)
        again = evaluate(open_engine(trial["checkpoint"]), valid.src, valid.tgt, settings)
        assert round(again.scores.bleu, 2) == trial["bleu"]


def test_test_scores_come_from_the_chosen_decoding(selected_run: Path, corpus_slice: Path) -> None:
    results = json.loads((selected_run / "results.json").read_text())
    hypotheses = (selected_run / "test.hyp").read_text(encoding="utf-8").splitlines()
    references = (corpus_slice / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()
    scores = corpus_scores(hypotheses, references, "en").rounded(prefix="test_")
    assert {k: results[k] for k in scores} == scores
    assert results["test_bleu_moses_lc"] >= 0.0


def test_rescore_chooses_again_and_keeps_the_run_statistics(selected_run: Path) -> None:
    before = json.loads((selected_run / "results.json").read_text())
    steps = sorted(p.name for p in (selected_run / "checkpoints").glob("step-*.ckpt"))
    results = rescore_run(
        selected_run, ["selection.average_last=2", "selection.beam=[2]", "selection.alpha=[1.0]"]
    )
    assert [(Path(t["checkpoint"]).name, t["beam"], t["alpha"]) for t in results["selection"]["trials"]] == [
        ("best.ckpt", 2, 1.0),
        ("averaged.ckpt", 2, 1.0),
    ]
    assert results["rescored_with"] == [
        "selection.average_last=2",
        "selection.beam=[2]",
        "selection.alpha=[1.0]",
    ]
    for key in ("global_step", "fit_seconds", "train_tokens_per_s", "parameters"):
        assert results[key] == before[key]
    assert json.loads((selected_run / "results.json").read_text()) == results
    assert sorted(p.name for p in (selected_run / "checkpoints").glob("step-*.ckpt")) == steps


def test_rescore_script_names_a_directory_that_is_not_a_run(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "scripts/rescore.py", str(tmp_path)], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert done.returncode == 2
    assert f"neither best.ckpt nor last.ckpt in {tmp_path}/checkpoints" in done.stderr
