"""Statistics of an ablation: mean and spread over seeds, and is a BLEU difference to the baseline real?

Two tests, both on the saved test translations. The sentence-level one is sacreBLEU's paired bootstrap
(:func:`paired_bootstrap`, pooled over the seeds both variants finished). The recipe-level one is a
two-level bootstrap (:func:`seed_and_sentence_bootstrap`):

sacreBLEU's paired bootstrap (``--paired-bs``) resamples test sentences: it asks whether two *fixed*
systems differ beyond what the choice of test sentences explains. An ablation compares training recipes,
and a recipe's BLEU also moves with the seed; two runs of the same exact attention (eager and flash
compute the same function) can differ "significantly" at the sentence level. This test resamples both
levels: every resample draws, for each variant independently, as many seeds as it has (with
replacement), and one set of test sentences (with replacement, shared by both variants, so the
comparison stays paired over sentences). Each variant's BLEU in a resample is corpus BLEU over the drawn
seeds' translations of the drawn sentences. The 95% interval is the percentile interval of the
difference; the p-value is two-sided: twice the share of resamples on the other side of zero, counted as
(k + 1) / (samples + 1) like sacreBLEU's, so it is never 0.

With 3 seeds a variant can only be drawn in 10 distinct seed multisets, so the test is coarse; it is
meant to keep a sentence-level "significant" from being read as a recipe-level one.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

from app.reports.variants import Variant

SAMPLES = 1000  # resamples of both bootstraps
SEED = 12345  # sacreBLEU's default SACREBLEU_SEED: the same p-values as its command line
SIGNIFICANCE = 0.05
# The columns :func:`baseline_comparison` fills, in the report's order; None where no test was made.
COMPARISON_COLUMNS = ("delta_bleu", "ci95", "p_value", "significant",
                      "seeds_low", "seeds_high", "p_value_seeds", "significant_seeds")  # fmt: skip


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation; std is None for fewer than two values."""
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


@contextmanager
def sacrebleu_seed(seed: int) -> Iterator[None]:
    """sacreBLEU reads its bootstrap seed from ``SACREBLEU_SEED``; set it for one test only."""
    before = os.environ.get("SACREBLEU_SEED")
    os.environ["SACREBLEU_SEED"] = str(seed)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SACREBLEU_SEED", None)
        else:
            os.environ["SACREBLEU_SEED"] = before


def paired_bootstrap(
    baseline: list[str],
    system: list[str],
    references: list[str],
    *,
    samples: int = SAMPLES,
    lowercase: bool = False,
) -> dict[str, float]:
    """sacreBLEU's paired bootstrap test of ``system`` against ``baseline`` (cased BLEU, or lowercased with
    ``lowercase``): the system's score, its bootstrap mean and 95% CI half-width, the difference and the
    p-value."""
    with sacrebleu_seed(SEED):
        test = PairedTest(
            [("baseline", baseline), ("system", system)],
            {"BLEU": BLEU(lowercase=lowercase)},
            [references],
            test_type="bs",
            n_samples=samples,
        )
        _, scores = test()
    base, result = scores["BLEU"]
    # sacreBLEU's p is (resamples at least as extreme + 1) / (samples + 1): identical outputs would get
    # 1 / 1001 and be marked significant (e.g. sdpa against eager, which compute the same attention)
    same = baseline == system
    return {
        "score": result.score,
        "mean": result.mean,
        "ci": result.ci,
        "delta": result.score - base.score,
        "p_value": 1.0 if same else result.p_value,
    }


def pooled_pair(
    baseline: Variant, variant: Variant, references: list[str]
) -> tuple[list[str], list[str], list[str], list[int]] | None:
    """Test translations of the seeds both variants finished, concatenated in seed order."""
    base_by_seed = {s: r.hypotheses for s, r in zip(baseline.seeds, baseline.runs, strict=True)}
    var_by_seed = {s: r.hypotheses for s, r in zip(variant.seeds, variant.runs, strict=True)}
    seeds = sorted(s for s in set(base_by_seed) & set(var_by_seed) if base_by_seed[s] and var_by_seed[s])
    if not seeds:
        return None
    base = [h for s in seeds for h in base_by_seed[s]]
    hyps = [h for s in seeds for h in var_by_seed[s]]
    if len(base) != len(hyps) or len(hyps) != len(references) * len(seeds):
        return None
    return base, hyps, references * len(seeds), seeds


def baseline_comparison(
    baseline: Variant | None, variant: Variant, references: list[str] | None
) -> dict[str, Any]:
    """The :data:`COMPARISON_COLUMNS` of ``variant`` against ``baseline``: the sentence-level test on the
    pooled seeds, then the seed-level one; all None for the baseline itself, a single seed, or no
    test set or translations to compare."""
    row: dict[str, Any] = dict.fromkeys(COMPARISON_COLUMNS)
    if baseline is None or references is None or variant is baseline or len(variant.runs) < 2:
        return row
    pair = pooled_pair(baseline, variant, references)
    if pair is None:
        return row
    test = paired_bootstrap(*pair[:3])
    row |= {
        "delta_bleu": round(test["delta"], 2),
        "ci95": round(test["ci"], 2),
        "p_value": round(test["p_value"], 4),
        "significant": test["p_value"] < SIGNIFICANCE,
    }
    return row | seed_level_test(baseline, variant, references)


def seed_level_test(baseline: Variant, variant: Variant, references: list[str]) -> dict[str, Any]:
    """The two-level (seeds and sentences) bootstrap on every seed each variant finished: the 95%
    interval of the difference and its p-value (nothing where a variant has fewer than two seeds)."""
    translations = [[r.hypotheses for r in v.runs if r.hypotheses] for v in (baseline, variant)]
    if any(len(seeds) < 2 for seeds in translations):
        return {}
    test = seed_and_sentence_bootstrap(*translations, references)
    return {
        "seeds_low": round(test["low"], 2),
        "seeds_high": round(test["high"], 2),
        "p_value_seeds": round(test["p_value"], 4),
        "significant_seeds": test["p_value"] < SIGNIFICANCE,
    }


def sentence_statistics(hypotheses: list[str], references: list[str]) -> np.ndarray:
    """sacreBLEU's per-sentence BLEU sufficient statistics (lengths, n-gram matches and totals).

    Returns (sentences, 10): hypothesis length, reference length, 4 x matches, 4 x totals.
    """
    return np.array(BLEU()._extract_corpus_statistics(hypotheses, [references]), dtype=np.int64)


def corpus_bleu(stats: np.ndarray) -> float:
    """Corpus BLEU from summed statistics (10,), with sacreBLEU's default smoothing."""
    return BLEU()._compute_score_from_stats([int(x) for x in stats]).score


def seed_and_sentence_bootstrap(
    baseline: list[list[str]],
    system: list[list[str]],
    references: list[str],
    *,
    samples: int = SAMPLES,
    seed: int = SEED,
) -> dict[str, float]:
    """Two-level bootstrap of ``system`` against ``baseline``, each given as one list of test translations
    per seed (any number of seeds, each aligned with ``references``).

    Returns ``delta`` (pooled BLEU of the system minus the baseline's, on all seeds and sentences),
    ``low`` and ``high`` (the 95% percentile interval of the resampled difference) and ``p_value``.
    """
    if not baseline or not system:
        raise ValueError("both variants need at least one seed's translations")
    for hypotheses in (*baseline, *system):
        if len(hypotheses) != len(references):
            raise ValueError(f"{len(hypotheses)} translations for {len(references)} references")
    base = np.stack([sentence_statistics(h, references) for h in baseline])  # (seeds_b, n, 10)
    sys_ = np.stack([sentence_statistics(h, references) for h in system])  # (seeds_s, n, 10)
    observed = corpus_bleu(sys_.sum((0, 1))) - corpus_bleu(base.sum((0, 1)))

    rng = np.random.default_rng(seed)
    n = len(references)
    sentence_counts = rng.multinomial(n, np.full(n, 1 / n), size=samples)  # (samples, n)
    deltas = np.empty(samples)
    for r in range(samples):
        pooled = [
            np.bincount(rng.integers(0, len(stats), len(stats)), minlength=len(stats))  # seed draw counts
            @ np.einsum("snk,n->sk", stats, sentence_counts[r])  # (seeds, 10) for the drawn sentences
            for stats in (base, sys_)
        ]
        deltas[r] = corpus_bleu(pooled[1]) - corpus_bleu(pooled[0])
    low, high = np.percentile(deltas, [2.5, 97.5])
    other_side = int(np.sum(deltas <= 0) if observed > 0 else np.sum(deltas >= 0))
    p_value = 1.0 if observed == 0 else min(1.0, 2 * (other_side + 1) / (samples + 1))
    return {"delta": observed, "low": float(low), "high": float(high), "p_value": p_value}
