"""SentencePiece subword tokenizers with fixed special ids, and their settings.

Training them on a corpus sample and caching them on disk is :mod:`app.data.subword_training`. The
special ids are the same for every model this toolkit trains, so model code can rely on them
(e.g. ``padding_idx=PAD_ID``) without looking at the tokenizer.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "MODEL_TYPES",
    "PAD_ID",
    "UNK_ID",
    "SubwordConfig",
    "SubwordSampling",
    "Tokenizer",
    "TokenizerError",
    "settings_from_config",
]

PAD_ID = 0
"""Padding; never produced by ``encode``; skipped by ``decode``."""
UNK_ID = 1
"""Unknown piece (characters outside the model's alphabet)."""
BOS_ID = 2
"""Beginning of sentence; added by the model code, not by ``encode``."""
EOS_ID = 3
"""End of sentence; added by the model code, not by ``encode``."""

log = logging.getLogger(__name__)

MODEL_TYPES = ("unigram", "bpe")
_SPECIAL_IDS = frozenset({PAD_ID, BOS_ID, EOS_ID})
_MIN_VOCAB_SIZE = 5  # the four specials plus at least one real piece
MAX_PIECES = 262_144
"""The largest vocabulary a sentencepiece model may have (training and reading alike)."""
MAX_MODEL_BYTES = 8 * 2**20
"""The largest serialized sentencepiece model read: a 262,144-piece model takes about 5 MiB."""


class TokenizerError(ValueError):
    """Invalid subword settings, or a model that cannot be trained or loaded with them."""


def settings_from_config(cls: type, options: dict[str, Any] | None, where: str) -> Any:
    """``cls(**options)`` for a settings dataclass, naming the config section and the valid keys when a
    key is unknown (instead of Python's "unexpected keyword argument")."""
    options = dict(options or {})
    valid = [field.name for field in fields(cls)]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise TokenizerError(f"unknown key(s) {unknown} in {where}; valid keys: {valid}")
    return cls(**options)


@dataclass(frozen=True)
class SubwordConfig:
    """Settings of the SentencePiece model(s); every field is part of the cache key.

    ``joint`` trains one model on source and target text together (shared vocabulary, allows tied
    embeddings); otherwise each side gets its own model of ``vocab_size`` pieces.
    ``input_sentence_size`` caps how many sentences (sampled with ``seed``) training reads: only
    those are fetched from the corpus, so training memory is bounded whatever the corpus size.
    """

    model_type: str = "unigram"
    vocab_size: int = 8000
    joint: bool = True
    character_coverage: float = 1.0
    max_sentence_length: int = 4096
    input_sentence_size: int = 1_000_000
    normalization_rule_name: str = "nmt_nfkc"
    seed: int = 0
    user_defined_symbols: tuple[str, ...] = ()  # always one piece each (e.g. data.concat's separator)

    def __post_init__(self) -> None:
        object.__setattr__(self, "user_defined_symbols", tuple(self.user_defined_symbols))  # YAML lists
        if self.model_type not in MODEL_TYPES:
            raise TokenizerError(f"model_type must be one of {list(MODEL_TYPES)}, got {self.model_type!r}")
        if not _MIN_VOCAB_SIZE <= self.vocab_size <= MAX_PIECES:
            raise TokenizerError(
                f"vocab_size must be > 4 (4 ids are reserved) and at most {MAX_PIECES:,}, "
                f"got {self.vocab_size}"
            )
        if not 0.0 < self.character_coverage <= 1.0:
            raise TokenizerError(f"character_coverage must be in (0, 1], got {self.character_coverage}")
        if self.max_sentence_length < 1 or self.input_sentence_size < 1:
            raise TokenizerError(
                "max_sentence_length and input_sentence_size must be >= 1, got "
                f"{self.max_sentence_length} and {self.input_sentence_size}"
            )


@dataclass(frozen=True)
class SubwordSampling:
    """Subword regularization (Kudo 2018): each training sentence is read in a segmentation drawn from
    its ``nbest_size`` best unigram segmentations, with probability proportional to P(x) ** ``alpha``,
    instead of always in the best one.

    ``nbest_size``: 0 turns sampling off; n > 1 samples from the n best. ``alpha`` in (0, 1]: smaller
    flattens the distribution (more, shorter pieces); 1 keeps the model's own probabilities. The draw
    is ours, from a numpy generator, not sentencepiece's built-in sampler: that one cannot be seeded
    reproducibly across processes, and an interrupted run must resume on the very same segmentations.
    """

    nbest_size: int = 0
    alpha: float = 0.1

    def __post_init__(self) -> None:
        if self.nbest_size == 1 or self.nbest_size < 0:
            raise TokenizerError(
                "data.subword_sampling.nbest_size must be 0 (off) or > 1 (sample from the n best), "
                f"got {self.nbest_size}"
            )
        if self.enabled and not 0.0 < self.alpha <= 1.0:
            raise TokenizerError(f"data.subword_sampling.alpha must be in (0, 1], got {self.alpha}")

    @classmethod
    def from_config(cls, options: dict[str, Any] | None, model_type: str = "unigram") -> SubwordSampling:
        """Settings from ``data.subword_sampling`` (None or absent: off), naming any unknown key; sampling
        needs the n-best list of a unigram model (``model_type``, from ``data.subword.model_type``)."""
        sampling = settings_from_config(cls, options, "data.subword_sampling")
        if sampling.enabled and model_type != "unigram":
            raise TokenizerError(
                f"data.subword_sampling needs data.subword.model_type=unigram, got {model_type!r} "
                "(a BPE model has no n-best list to sample from)"
            )
        return sampling

    @property
    def enabled(self) -> bool:
        """Whether training sentences are re-segmented (``nbest_size`` is not 0)."""
        return self.nbest_size != 0


class Tokenizer:
    """A loaded SentencePiece model with a batch API and the toolkit's fixed special ids."""

    def __init__(self, processor: spm.SentencePieceProcessor) -> None:
        self._sp = processor
        self._piece_scores: np.ndarray | None = None  # (vocab,) unigram log-probabilities, on first use
        expected = {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID}
        actual = {
            "pad": processor.pad_id(),
            "unk": processor.unk_id(),
            "bos": processor.bos_id(),
            "eos": processor.eos_id(),
        }
        if actual != expected:
            raise TokenizerError(f"sentencepiece model has special ids {actual}, expected {expected}")

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Load a ``.model`` file."""
        return cls.from_bytes(Path(path).read_bytes())

    @classmethod
    def from_bytes(cls, model_proto: bytes) -> Tokenizer:
        """Rebuild a tokenizer from :meth:`to_bytes` output (e.g. stored inside a checkpoint).

        Raises :class:`TokenizerError` for bytes that are not a sentencepiece model, or one over
        :data:`MAX_MODEL_BYTES` (refused before parsing) or :data:`MAX_PIECES`.
        """
        if len(model_proto) > MAX_MODEL_BYTES:
            raise TokenizerError(
                f"a sentencepiece model of {len(model_proto):,} bytes; at most {MAX_MODEL_BYTES:,} are read"
            )
        try:
            processor = spm.SentencePieceProcessor(model_proto=model_proto)
        except RuntimeError as err:  # sentencepiece's parse failure ("INTERNAL: ... ParseFromArray")
            raise TokenizerError(f"not a valid sentencepiece model ({str(err).strip()[:200]})") from err
        if processor.vocab_size() > MAX_PIECES:
            raise TokenizerError(
                f"a sentencepiece model of {processor.vocab_size():,} pieces; at most {MAX_PIECES:,}"
            )
        return cls(processor)

    def to_bytes(self) -> bytes:
        """The serialized model proto: everything needed to rebuild this tokenizer."""
        return self._sp.serialized_model_proto()

    @property
    def vocab_size(self) -> int:
        """Number of pieces, including the four special ones."""
        return self._sp.vocab_size()

    @property
    def pad_id(self) -> int:
        """Padding id (always :data:`PAD_ID`)."""
        return PAD_ID

    @property
    def unk_id(self) -> int:
        """Unknown-piece id (always :data:`UNK_ID`)."""
        return UNK_ID

    @property
    def bos_id(self) -> int:
        """Beginning-of-sentence id (always :data:`BOS_ID`)."""
        return BOS_ID

    @property
    def eos_id(self) -> int:
        """End-of-sentence id (always :data:`EOS_ID`)."""
        return EOS_ID

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Piece ids for each text, without BOS/EOS (the model code adds those where it needs them)."""
        return self._sp.encode(list(texts), out_type=int)

    def encode_sampled(
        self, texts: list[str], sampling: SubwordSampling, rng: np.random.Generator
    ) -> list[list[int]]:
        """One segmentation per text, drawn by ``rng`` from its n best (see :class:`SubwordSampling`).

        A segmentation's unigram log-probability is the sum of its pieces' scores, so the weights
        P(x) ** alpha need nothing from sentencepiece but the n-best list and the score table.
        """
        candidates = self._sp.nbest_encode(list(texts), nbest_size=sampling.nbest_size, out_type=int)
        uniforms = rng.random(len(candidates))
        return [
            options[self._draw(options, sampling.alpha, uniform)]
            for options, uniform in zip(candidates, uniforms, strict=True)
        ]

    def _draw(self, options: list[list[int]], alpha: float, uniform: float) -> int:
        """Index of the segmentation that ``uniform`` picks, weighting each by exp(alpha * log P)."""
        if len(options) < 2:
            return 0
        if self._piece_scores is None:
            self._piece_scores = np.array([self._sp.get_score(i) for i in range(self.vocab_size)])
        lengths = np.fromiter(map(len, options), dtype=np.int64, count=len(options))
        flat = np.fromiter(itertools.chain.from_iterable(options), dtype=np.int64, count=int(lengths.sum()))
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        log_p = np.add.reduceat(self._piece_scores[flat], starts)  # (n,) every option has >= 1 piece
        weights = np.exp(alpha * (log_p - log_p.max()))
        cumulative = np.cumsum(weights)
        return min(int(np.searchsorted(cumulative, uniform * cumulative[-1], side="right")), len(options) - 1)

    def decode(self, ids: Iterable[Iterable[int]]) -> list[str]:
        """Detokenized text for each id sequence.

        Pad/BOS/EOS and ids outside the vocabulary are skipped, so raw model output (padded, with EOS)
        can be decoded directly; UNK is kept and shows as `` ⁇ ``.
        """
        vocab_size = self.vocab_size
        cleaned = [[i for i in map(int, seq) if 0 <= i < vocab_size and i not in _SPECIAL_IDS] for seq in ids]
        return self._sp.decode(cleaned)

    def id_to_piece(self, ids: list[int]) -> list[str]:
        """The piece string of each id (for inspection and attention plots)."""
        return [self._sp.id_to_piece(int(i)) for i in ids]

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size})"
