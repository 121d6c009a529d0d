"""The JSON bodies of the service: ``POST /translate`` in and out, ``GET /health``, and every error.

Strict on purpose: a field of the wrong type or an unknown option (a typo like ``"beams"``) is an error
the client sees (422 with the field named), never silently ignored or coerced. Every field that costs
work has an upper bound, and non-finite numbers (``Infinity``, ``NaN``) are refused, so no value that
passes validation can make the engine fail or run without limit. FastAPI reads these models to write
the OpenAPI schema (``/openapi.json``, ``/docs``), so a generated client knows every shape.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from app.decoding import Sampling
from app.decoding.beam import MAX_LENGTH_PENALTY
from app.decoding.sampling import MAX_TEMPERATURE, MIN_TEMPERATURE
from app.inference.engine import SearchSettings

MAX_BEAM = 32
MAX_NBEST = 64  # hypotheses per sentence: <= beam for search, samples when sampling
MAX_OUTPUT_TOKENS = 1024
MAX_SEED = 2**32 - 1  # CTranslate2's seed is an unsigned 32-bit int
SAMPLE_PATTERN = r"^(topk:[0-9]{1,6}|topp:[0-9.]{1,12})$"
LANG_PATTERN = r"^[A-Za-z][A-Za-z0-9_]{0,15}$"  # a language code as data.directions names it
MAX_ATTENTION_SENTENCES = 4  # attention maps per request: each is (output x source) numbers of JSON


def integral(value: Any) -> Any:
    """``5.0`` as ``5``: JSON (and JSON Schema's ``integer``) does not tell them apart; ``5.5`` and
    ``"5"`` stay errors under strict validation."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Int = Annotated[int, BeforeValidator(integral)]


class TranslateRequest(BaseModel):
    """``{"sentences": [...], "beam": 5, ...}``; every option has the ``translate.py`` default."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    sentences: list[str] = Field(min_length=1, description="source sentences, 1 to --max-sentences")
    beam: Int = Field(5, ge=1, le=MAX_BEAM, description="1 = greedy search")
    nbest: Int = Field(1, ge=1, le=MAX_NBEST, description="hypotheses per sentence (<= beam unless sampling)")
    length_penalty: float = Field(
        0.6, ge=0.0, le=MAX_LENGTH_PENALTY, description="GNMT length penalty exponent"
    )
    max_len: Int = Field(256, ge=1, le=MAX_OUTPUT_TOKENS, description="cap on output subwords")
    sample: str | None = Field(
        None, pattern=SAMPLE_PATTERN, description="topk:K or topp:P: sample instead of searching"
    )
    temperature: float = Field(
        1.0, ge=MIN_TEMPERATURE, le=MAX_TEMPERATURE, description="sampling temperature"
    )
    seed: Int = Field(0, ge=0, le=MAX_SEED, description="sampling seed")
    target_lang: str | None = Field(
        None,
        pattern=LANG_PATTERN,
        description="the language to translate into: needed by a multilingual model, checked by any",
    )
    attention: bool = Field(
        False,
        description=f"answer each sentence's cross-attention map too (at most {MAX_ATTENTION_SENTENCES} "
        "sentences, best translation only: no nbest, no sample; engines with weights only)",
    )

    @field_validator("sentences")
    @classmethod
    def valid_unicode(cls, sentences: list[str]) -> list[str]:
        """JSON can escape a lone surrogate (``"\\ud800"``), which is no character: the tokenizer fails."""
        for index, sentence in enumerate(sentences):
            try:
                sentence.encode("utf-8")
            except UnicodeEncodeError as err:
                raise ValueError(
                    f"sentence {index} is not valid Unicode ({err.reason} at {err.start})"
                ) from None
        return sentences

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
            target_lang=self.target_lang,
        )


class Hypothesis(BaseModel):
    """One scored output; lists of these answer a request that names ``nbest`` or samples."""

    text: str
    score: float = Field(description="summed log-probability (over the length penalty in beam search)")


class AttentionMapBody(BaseModel):
    """Where each output subword looked: ``weights[t][s]`` is output piece ``t`` on source piece ``s``."""

    source_tokens: list[str] = Field(description="the source's subword pieces, then </s>")
    target_tokens: list[str] = Field(description="the output's subword pieces, then </s>")
    weights: list[list[float]] = Field(description="one row per target token, each summing to 1")


class TranslateResponse(BaseModel):
    """One entry per input sentence, in input order: a string, or (``nbest``/``sample``) a list."""

    translations: list[str] | list[list[Hypothesis]]
    attention: list[AttentionMapBody | None] | None = Field(
        None, description="asked with attention: one map per sentence (null for a blank one)"
    )


class FieldProblem(BaseModel):
    """What is wrong with one field: ``sentences.1`` names the second sentence."""

    field: str
    problem: str


class ErrorBody(BaseModel):
    """Every error the service answers (4xx and 5xx) has this shape."""

    error: str = Field(description="what went wrong, with the value and the limit where there is one")
    detail: list[FieldProblem] | str | None = Field(None, description="per-field problems (422)")
    retry_after: int | None = Field(None, description="seconds to wait before retrying (503)")


class Health(BaseModel):
    """``GET /health``: 200 when the worker is alive and keeping up, 503 (same body) otherwise."""

    status: Literal["ok", "stuck", "dead", "stopping"]
    engine: str
    queued: int = Field(description="requests waiting for the worker")
    oldest_queued_s: float = Field(description="age of the oldest waiting request, seconds")
    running_s: float = Field(description="how long the engine call now running has run (0: idle)")
    batches_run: int = Field(description="engine calls made; merged requests make fewer")
    target_languages: list[str] = Field(
        default_factory=list, description="a multilingual model's target_lang choices (else empty)"
    )
    attention: bool = Field(False, description="whether the engine answers attention maps")
