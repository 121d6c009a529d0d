"""Search over a model's ``decode_step``: greedy, beam search with a length penalty (n-best), sampling."""

from app.decoding.beam import beam_hypotheses, beam_search
from app.decoding.greedy import greedy_hypotheses, greedy_search
from app.decoding.hypothesis import Hypothesis
from app.decoding.limits import output_limits
from app.decoding.sampling import Sampling, sample_search

__all__ = [
    "Hypothesis",
    "Sampling",
    "beam_hypotheses",
    "beam_search",
    "greedy_hypotheses",
    "greedy_search",
    "output_limits",
    "sample_search",
]
