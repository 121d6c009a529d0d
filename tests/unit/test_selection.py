"""Choosing on validation: the search grid, the winning trial, the config checks; Moses-tokenized BLEU."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.training import compose_train
from sacrebleu.metrics import BLEU

from app.inference.engine import SearchSettings
from app.inference.metrics import corpus_scores, moses_bleu_lc
from app.inference.selection import Trial, best_trial, check_selection, search_grid


def test_search_grid_is_every_beam_with_every_alpha() -> None:
    base = SearchSettings(beam=5, alpha=0.6, batch_size=7)
    grid = search_grid(base, [4, 8], [0.6, 1.0])
    assert [(s.beam, s.alpha) for s in grid] == [(4, 0.6), (4, 1.0), (8, 0.6), (8, 1.0)]
    assert {s.batch_size for s in grid} == {7}, "settings not in the grid keep the base's values"
    assert search_grid(base) == [base]
    assert [(s.beam, s.alpha) for s in search_grid(base, None, [1.0])] == [(5, 1.0)]


def test_best_trial_takes_the_highest_bleu_and_the_first_of_a_tie() -> None:
    trials = [
        Trial("best.ckpt", 5, 0.6, bleu=30.0, bleu_lc=31.0),
        Trial("averaged.ckpt", 5, 0.6, bleu=31.5, bleu_lc=32.0),
        Trial("averaged.ckpt", 8, 1.0, bleu=31.5, bleu_lc=32.9),
    ]
    assert best_trial(trials) is trials[1]
    assert best_trial(trials, "bleu_lc") is trials[2]  # a case-folded recipe is chosen on lowercased BLEU
    with pytest.raises(ValueError, match="at least one"):
        best_trial([])
    with pytest.raises(ValueError, match="valid: bleu, bleu_lc"):
        best_trial(trials, "chrf")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["selection.average_last=5", "checkpoint.every_n_steps=100", "checkpoint.keep_last=3"],
            "keep_last >= 5",
        ),
        (
            ["selection.average_last=2", "checkpoint.every_n_steps=null", "checkpoint.keep_last=2"],
            "every_n_steps",
        ),
        (["selection.beam=5"], r"selection.beam must be a non-empty list"),
        (["selection.alpha=[]"], r"selection.alpha must be a non-empty list"),
        (["+selection.beams=[4]"], r"unknown selection option\(s\) \['beams'\]; valid options: alpha"),
        (["selection.metric=chrf"], r"selection.metric='chrf'; valid choices: bleu, bleu_lc"),
    ],
)
def test_a_selection_that_cannot_be_carried_out_is_refused(overrides: list[str], message: str) -> None:
    cfg = compose_train(overrides)
    with pytest.raises(ValueError, match=message):
        check_selection(cfg)


def test_the_default_selection_and_the_best_recipes_are_accepted() -> None:
    check_selection(compose_train([]))
    for experiment in ("multi30k_best_de_en", "multi30k_best_en_de", "multi30k_best_en_de_lc"):
        cfg = compose_train([f"experiment={experiment}"])
        check_selection(cfg)
        assert cfg.selection.average_last <= cfg.checkpoint.keep_last


def test_moses_bleu_lc_scores_lowercased_moses_tokens() -> None:
    hypotheses = ['Ein Mann, der "Hallo" sagt.', "Zwei Hunde spielen im Schnee."]
    references = ['Ein Mann, der "hallo" ruft.', "Zwei Hunde spielen im Schnee!"]
    # the same text tokenized by hand as the Moses tokenizer does (punctuation split off), lowercased
    tokenized_hyps = ['ein mann , der " hallo " sagt .', "zwei hunde spielen im schnee ."]
    tokenized_refs = ['ein mann , der " hallo " ruft .', "zwei hunde spielen im schnee !"]
    expected = BLEU(tokenize="none", force=True).corpus_score(tokenized_hyps, [tokenized_refs]).score
    assert moses_bleu_lc(hypotheses, references, "de") == pytest.approx(expected)
    scores = corpus_scores(hypotheses, references, "de")
    assert scores.bleu_moses_lc == pytest.approx(expected)
    assert "bleu_moses_lc" in scores.rounded()
    assert "bleu_moses_lc" not in corpus_scores(hypotheses, references).rounded()


def test_moses_tokens_differ_from_sacrebleu_13a() -> None:
    """The reason both are reported: Moses splits apostrophes and hyphens, 13a does not."""
    hypotheses, references = ["A man's T-shirt is red."], ["The man's T-shirt was red."]
    assert moses_bleu_lc(hypotheses, references, "en") != pytest.approx(
        corpus_scores(hypotheses, references).bleu_lc
    )


def test_the_validation_metric_also_picks_best_ckpt_and_stops_early(tmp_path: Path) -> None:
    from pytorch_lightning.callbacks import EarlyStopping

    from app.training.task import checkpoint_callbacks, training_callbacks

    for metric in ("bleu", "bleu_lc"):
        cfg = compose_train([f"selection.metric={metric}", "early_stopping.patience=3"])
        assert checkpoint_callbacks(cfg, tmp_path)[0].monitor == f"val/{metric}"
        stopping = [c for c in training_callbacks(cfg, tmp_path) if isinstance(c, EarlyStopping)]
        assert [c.monitor for c in stopping] == [f"val/{metric}"]
