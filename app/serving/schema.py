"""The JSON body of ``POST /translate``: the sentences and optional decoding options.

Strict on purpose: a field of the wrong type or an unknown option (a typo like ``"beams"``) is an error
the client sees (422 with the field named), never silently ignored or coerced.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from app.decoding import Sampling
from app.inference.translator import SearchSettings

MAX_BEAM = 32
MAX_OUTPUT_TOKENS = 1024


class TranslateRequest(BaseModel):
    """``{"sentences": [...], "beam": 5, ...}``; every option has the ``translate.py`` default."""

    model_config = ConfigDict(extra="forbid", strict=True)

    sentences: list[str] = Field(min_length=1)
    beam: int = Field(5, ge=1, le=MAX_BEAM, description="1 = greedy search")
    nbest: int = Field(1, ge=1, description="hypotheses per sentence (<= beam unless sampling)")
    length_penalty: float = Field(0.6, ge=0.0, le=5.0, description="GNMT length penalty exponent")
    max_len: int = Field(256, ge=1, le=MAX_OUTPUT_TOKENS, description="cap on output subwords")
    sample: str | None = Field(None, description="topk:K or topp:P: sample instead of searching")
    temperature: float = Field(1.0, gt=0.0, description="sampling temperature")
    seed: int = Field(0, description="sampling seed")

    @property
    def wants_scores(self) -> bool:
        """Answer with lists of scored hypotheses when the client named ``nbest`` (or samples)."""
        return "nbest" in self.model_fields_set or self.sample is not None

    def settings(self, batch_size: int) -> SearchSettings:
        """The decoding asked for; an inconsistent combination raises ValueError naming it."""
        sampling = (
            Sampling.parse(self.sample, temperature=self.temperature, seed=self.seed) if self.sample else None
        )
        return SearchSettings(
            beam=self.beam,
            alpha=self.length_penalty,
            max_len=self.max_len,
            batch_size=batch_size,
            nbest=self.nbest,
            sampling=sampling,
        )
