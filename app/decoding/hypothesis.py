"""What every search returns per output: token ids with their log-probabilities."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Hypothesis:
    """One output of a search: ``tokens`` without BOS/EOS, the model's log-probability of each token
    (``token_scores``, EOS last when the output ended with it) and the ranking ``score``: the summed
    log-probability, divided by the length penalty in beam search."""

    tokens: list[int]
    score: float
    token_scores: list[float] = field(default_factory=list)
