"""The one interface of inference: an :class:`Engine` takes sentences and gives ranked translations.

Two engines implement it: :class:`~app.inference.torch_engine.TorchEngine` (our PyTorch model and search,
from a checkpoint) and :class:`~app.inference.ct2_engine.CT2Engine` (a CTranslate2 export). The command
line, test-set evaluation, choosing on validation, the server, the benchmarks and the reports all take
an ``Engine`` and never ask which one it is: what only some engines can do (attention maps) is a method
of the interface that the others refuse with a ValueError naming the engine.

Every engine keeps the guarantees of ``translate.py``: input order kept, a blank sentence gives one empty
translation, an over-long source is truncated to the model's limit (reported), never dropped.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from app.data.multilingual import Languages
from app.data.tokenizer import Tokenizer
from app.decoding import Sampling
from app.decoding.beam import LENGTH_NORMS, check_length_penalty

Truncated = Callable[[int, int], None]  # (index in the batch, source length in subwords)


@dataclass(frozen=True)
class SearchSettings:
    """How to decode: beam or greedy search, or sampling, with its output limits and batch size."""

    beam: int = 5  # 1 = greedy search
    alpha: float = 0.6  # GNMT length penalty exponent (beam search only)
    # How beam search divides a score by length: gnmt | power (app.decoding.beam.length_penalty); None:
    # the model's own (its checkpoint's test_search.length_norm: power for imported Marian models, else gnmt)
    length_norm: str | None = None
    max_len: int = 256  # hard cap on output tokens
    len_ratio: float = 1.5  # per-sentence cap: len_ratio * source tokens + len_extra
    len_extra: int = 10
    batch_size: int = 64  # sentences per search batch
    nbest: int = 1  # hypotheses per sentence: at most ``beam``, or any number of samples
    sampling: Sampling | None = None  # sample instead of searching (``beam`` is then ignored)
    # The language to translate into: a multilingual model gets its tag before each source (TaggedEngine);
    # None: a bilingual model's own. Not the scoring language (evaluate's moses_lang).
    target_lang: str | None = None

    def __post_init__(self) -> None:
        if self.beam < 1 or self.batch_size < 1 or self.max_len < 1 or self.nbest < 1:
            raise ValueError(
                f"beam ({self.beam}), batch_size ({self.batch_size}), max_len ({self.max_len}) and "
                f"nbest ({self.nbest}) must all be >= 1"
            )
        if self.length_norm not in (None, *LENGTH_NORMS):
            raise ValueError(
                f"length_norm must be one of {', '.join(LENGTH_NORMS)}, got {self.length_norm!r}"
            )
        if self.sampling is None and self.nbest > self.beam:
            raise ValueError(f"nbest={self.nbest} needs a beam at least as wide (got beam={self.beam})")
        check_length_penalty(self.alpha)


@dataclass
class Translation:
    """One output for one input sentence."""

    text: str
    score: float  # ranking score: summed log-probability (over the length penalty in beam search)
    token_scores: list[float]  # log-probability of each output subword, then of EOS
    alignment: list[tuple[int, int]] | None = None  # (target, source) subword pairs; torch engine only


@dataclass
class AttentionMap:
    """One translated sentence with its cross-attention: target positions against source positions."""

    translation: str
    source_tokens: list[str]  # subword pieces of the source, then </s>
    target_tokens: list[str]  # subword pieces of the output, then </s>
    weights: torch.Tensor = field(repr=False)  # (len(target_tokens), len(source_tokens)), rows sum to 1


class Engine(ABC):
    """Sentences in, ranked translations out."""

    name: str  # the engine's kind: "torch" or "ct2"
    source: str = "<in memory>"  # what it was loaded from (a checkpoint file, an export directory)
    max_source_tokens: int
    tgt_tokenizer: Tokenizer  # counts output tokens for speed figures
    languages: Languages | None = None  # the directions it was trained on (set by open_engine)
    has_attention_maps: bool = False  # whether attention_maps can answer (a kernel may still refuse)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @abstractmethod
    def translate_nbest(
        self,
        sentences: list[str],
        settings: SearchSettings,
        on_truncate: Truncated | None = None,
        *,
        details: bool = False,
    ) -> list[list[Translation]]:
        """``settings.nbest`` translations per sentence, best first; ``details`` adds per-token scores
        (and, where the engine can, alignments), which cost extra work."""

    def translate(
        self, sentences: list[str], settings: SearchSettings, on_truncate: Truncated | None = None
    ) -> list[str]:
        """The best translation of each sentence (the ``translate.py`` text output)."""
        return [hyps[0].text for hyps in self.translate_nbest(sentences, settings, on_truncate)]

    def compile_report(self) -> str | None:
        """What compiling the decoding steps did and cost (``--compile``), or None where nothing compiles."""
        return None

    def attention_maps(
        self,
        sentences: list[str],
        settings: SearchSettings,
        *,
        layer: int | None = None,
        head: int | None = None,
        on_truncate: Truncated | None = None,
    ) -> list[AttentionMap | None]:
        """Translations with their cross-attention maps, in order (None for blank sentences).

        Engines that cannot read attention weights refuse, naming themselves.
        """
        raise ValueError(f"the {self.name} engine has no attention weights: use the torch engine")


def split_blank(sentences: list[str]) -> list[int]:
    """Indices of the sentences with something to translate."""
    return [i for i, s in enumerate(sentences) if s.strip()]


def fill_blank(count: int, todo: list[int], found: list[list[Translation]]) -> list[list[Translation]]:
    """Results for all ``count`` sentences: ``found`` at ``todo``, one empty translation elsewhere."""
    results = [[Translation(text="", score=0.0, token_scores=[])] for _ in range(count)]
    for index, hyps in zip(todo, found, strict=True):
        results[index] = hyps
    return results


def on_subset(todo: list[int], on_truncate: Truncated | None) -> Truncated | None:
    """``on_truncate`` for the non-blank subset ``todo``: reports indices of the full input."""
    return (lambda j, n: on_truncate(todo[j], n)) if on_truncate else None
