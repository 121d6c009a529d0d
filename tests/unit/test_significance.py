"""The two-level (seeds and sentences) bootstrap: what it answers that the sentence-level test does not."""

from __future__ import annotations

import pytest

from app.reports.significance import (
    corpus_bleu,
    paired_bootstrap,
    seed_and_sentence_bootstrap,
    sentence_statistics,
)

SIZES = ("big", "small")
REFS = [f"a {w} dog runs across the green park with {n} friends ." for n in range(12) for w in SIZES]
MEDIUM = [f"a {w} dog runs in the park ." for _ in range(12) for w in SIZES]
POOR = ["a cat ." for _ in REFS]


def test_statistics_give_sacrebleus_corpus_score() -> None:
    from sacrebleu.metrics import BLEU

    stats = sentence_statistics(MEDIUM, REFS)
    assert stats.shape == (len(REFS), 10)
    assert corpus_bleu(stats.sum(0)) == pytest.approx(BLEU().corpus_score(MEDIUM, [REFS]).score)


def test_identical_recipes_are_not_different() -> None:
    result = seed_and_sentence_bootstrap([MEDIUM, MEDIUM], [MEDIUM, MEDIUM], REFS)
    assert result["delta"] == 0 and result["p_value"] == 1.0


def test_a_consistently_better_recipe_is_significant() -> None:
    result = seed_and_sentence_bootstrap([POOR, POOR, POOR], [MEDIUM, MEDIUM, MEDIUM], REFS, samples=200)
    assert result["delta"] > 10 and result["low"] > 0 and result["p_value"] < 0.05


def test_one_lucky_seed_is_significant_for_sentences_but_not_for_seeds() -> None:
    """Pooled over seeds, a perfect seed beside a poor one beats the baseline on almost every resample of
    sentences; resampling the seeds too draws the poor seed twice a quarter of the time."""
    baseline, system = [MEDIUM, MEDIUM], [REFS, POOR]
    sentences = paired_bootstrap(baseline[0] + baseline[1], system[0] + system[1], REFS * 2)
    seeds = seed_and_sentence_bootstrap(baseline, system, REFS)
    assert sentences["delta"] == pytest.approx(seeds["delta"])
    assert sentences["p_value"] < 0.05
    assert seeds["p_value"] > 0.05 and seeds["low"] < 0 < seeds["high"]


def test_misaligned_translations_are_refused() -> None:
    with pytest.raises(ValueError, match="3 translations for 24 references"):
        seed_and_sentence_bootstrap([MEDIUM], [MEDIUM[:3]], REFS)
    with pytest.raises(ValueError, match="at least one seed"):
        seed_and_sentence_bootstrap([], [MEDIUM], REFS)
