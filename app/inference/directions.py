"""Scores of a multilingual set, per direction and their mean.

A multilingual validation or test set is the concatenation of its directions (rows ``start:stop`` of
each, :attr:`app.data.corpora.Split.spans`). Each direction is scored on its own (sacreBLEU,
with its target language for the Moses-tokenized score) and the headline number is the unweighted mean
over directions, so a direction counts the same whatever its size: ``val/bleu`` (best.ckpt, early
stopping, the selection grid) and ``test_bleu`` are that mean; ``val/bleu/de-en`` and ``test_bleu/de-en``
the parts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.data.multilingual import parse_direction
from app.inference.metrics import Scores, corpus_scores

Spans = Sequence[tuple[str, int, int]]  # (direction, start, stop) rows of each direction
MEAN_METRICS = ("bleu", "bleu_lc", "chrf", "bleu_moses_lc")


def direction_scores(
    hypotheses: Sequence[str | None], references: Sequence[str], spans: Spans, *, moses: bool = True
) -> dict[str, Scores]:
    """Each direction's corpus scores (``moses``: with the Moses-tokenized lowercased BLEU too); a span
    only partly decoded (``None`` hypotheses) is scored on the rows that were."""
    scores = {}
    for direction, start, stop in spans:
        pairs = [
            (h, r)
            for h, r in zip(hypotheses[start:stop], references[start:stop], strict=True)
            if h is not None
        ]
        if pairs:
            hyps, refs = map(list, zip(*pairs, strict=True))
            scores[direction] = corpus_scores(hyps, refs, parse_direction(direction)[1] if moses else None)
    return scores


def mean_scores(scores: dict[str, Scores]) -> dict[str, float]:
    """The unweighted mean over directions of each metric every direction has."""
    means = {}
    for metric in MEAN_METRICS:
        values = [getattr(s, metric) for s in scores.values()]
        if values and all(v is not None for v in values):
            means[metric] = sum(values) / len(values)
    return means


def direction_results(
    hypotheses: Sequence[str], references: Sequence[str], spans: Spans, prefix: str = "test_"
) -> dict[str, Any]:
    """results.json keys: ``test_bleu`` (etc.) as the mean over directions, ``test_bleu/de-en`` (etc.) per
    direction, and ``test_directions``, the directions in order."""
    scores = direction_scores(hypotheses, references, spans)
    results: dict[str, Any] = {f"{prefix}{k}": round(v, 2) for k, v in mean_scores(scores).items()}
    for direction, found in scores.items():
        rounded = found.rounded(prefix=prefix)
        rounded.pop(f"{prefix}signature")
        results.update({f"{key}/{direction}": value for key, value in rounded.items()})
    results[f"{prefix}directions"] = list(scores)
    return results
