"""Is a BLEU difference between two variants real *across training runs*? A two-level bootstrap.

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

import numpy as np
from sacrebleu.metrics import BLEU

SAMPLES = 1000
SEED = 12345


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
