"""Search over a model's ``decode_step``: greedy and beam search with a length penalty."""

from app.decoding.beam import beam_search
from app.decoding.greedy import greedy_search
from app.decoding.limits import output_limits

__all__ = ["beam_search", "greedy_search", "output_limits"]
