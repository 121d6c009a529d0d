"""Where a search's time goes: the encoder, the decoder's steps, and the rest (the search's own work).

Wraps a model's ``encode`` and ``decode_step`` with wall-clock timers for the span of a ``with`` block
(on the instance: the class and other models are untouched) and counts the steps and the decoder rows
they computed, so a benchmark can say how much of a beam search is the model and how much its
bookkeeping (ranking candidates, reordering caches, collecting finished hypotheses, tokenization).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from torch import nn


@dataclass
class DecodeSplit:
    """Seconds spent in each part of a search, with the decoder's step and row counts."""

    encode_s: float = 0.0
    steps_s: float = 0.0
    steps: int = 0  # decode_step calls (each advances every live row by one token)
    rows: int = 0  # decoder rows over all steps (beam search: live sentences x beam)

    def as_row(self, total_s: float) -> dict[str, float | int]:
        """The split of ``total_s`` seconds (timed around the whole search) as a JSON-ready row."""
        return {
            "seconds": round(total_s, 3),
            "encode_s": round(self.encode_s, 3),
            "steps_s": round(self.steps_s, 3),
            "rest_s": round(total_s - self.encode_s - self.steps_s, 3),
            "steps": self.steps,
            "rows": self.rows,
        }


@contextmanager
def timed_parts(model: nn.Module) -> Iterator[DecodeSplit]:
    """Time ``model.encode`` and ``model.decode_step`` while the block runs; restored afterwards."""
    split = DecodeSplit()
    encode, decode_step = model.encode, model.decode_step
    own = {name: model.__dict__[name] for name in ("encode", "decode_step") if name in model.__dict__}

    def timed_encode(*args, **kwargs):
        started = time.perf_counter()
        try:
            return encode(*args, **kwargs)
        finally:
            split.encode_s += time.perf_counter() - started

    def timed_step(tokens, *args, **kwargs):
        started = time.perf_counter()
        try:
            return decode_step(tokens, *args, **kwargs)
        finally:
            split.steps_s += time.perf_counter() - started
            split.steps += 1
            split.rows += tokens.size(0)

    model.encode, model.decode_step = timed_encode, timed_step
    try:
        yield split
    finally:
        for name in ("encode", "decode_step"):  # back to what the instance had (usually the class's methods)
            if name in own:
                model.__dict__[name] = own[name]
            else:
                del model.__dict__[name]
