"""SentencePiece subword tokenizers with fixed special ids and a content-keyed on-disk cache.

A cached model heals: its SHA-256 is written beside it (``<model>.sha256``), and a model that fails to
load or to match it is moved aside (``<model>.corrupt-<time>``) and trained again, with a warning.

The special ids are the same for every model this toolkit trains, so model code can rely on them
(e.g. ``padding_idx=PAD_ID``) without looking at the tokenizer.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import logging
import os
import re
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm

from app.data.corpus import TextColumn, TextDigest
from app.io import atomic_write, file_sha256, move_aside
from app.ranks import launched_as_local_zero, wait_for_file

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
    "train_or_load",
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
_SAMPLE_CHUNK = 10_000  # sentences fetched per Arrow call while streaming the training sample


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
        if self.vocab_size < _MIN_VOCAB_SIZE:
            raise TokenizerError(f"vocab_size must be > 4 (4 ids are reserved), got {self.vocab_size}")
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
        """Rebuild a tokenizer from :meth:`to_bytes` output (e.g. stored inside a checkpoint)."""
        return cls(spm.SentencePieceProcessor(model_proto=model_proto))

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


def _texts_fingerprint(parts: Sequence[Sequence[str]]) -> str:
    """Content hash of the texts of all parts, in order (line boundaries included, see TextDigest)."""
    digest = TextDigest()
    for texts in parts:
        if isinstance(texts, TextColumn):
            texts.update_digest(digest)  # straight from the Arrow buffers
        else:
            digest.update_texts(texts)
    return digest.hexdigest()


def _cache_key(config: SubwordConfig, corpus_key: str, side: str, fingerprint: str) -> str:
    settings = asdict(config)
    if not settings["user_defined_symbols"]:  # models trained before the option existed keep their key
        del settings["user_defined_symbols"]
    payload = {"config": settings, "corpus_key": corpus_key, "side": side, "texts": fingerprint}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode("utf-8")).hexdigest()[:16]


def _model_path(
    cache_dir: Path, config: SubwordConfig, corpus_key: str, side: str, parts: Sequence[Sequence[str]]
) -> Path:
    """Cache file name: readable prefix plus a hash of everything that determines the model."""
    key = _cache_key(config, corpus_key, side, _texts_fingerprint(parts))
    safe_corpus = re.sub(r"[^A-Za-z0-9._-]+", "_", corpus_key).strip("_") or "corpus"
    return cache_dir / f"spm-{safe_corpus}-{side}-{config.model_type}{config.vocab_size}-{key}.model"


def sample_indices(total: int, limit: int, seed: int) -> np.ndarray | None:
    """Sorted positions of ``limit`` of ``total`` sentences drawn without replacement from ``seed``;
    ``None`` when ``total <= limit`` (every sentence is used, in corpus order)."""
    if total <= limit:
        return None
    return np.sort(np.random.default_rng(seed).choice(total, size=limit, replace=False))


def _take(texts: Sequence[str], indices: np.ndarray) -> list[str]:
    take = getattr(texts, "take", None)  # an Arrow-backed column fetches a chunk in one call
    return take(indices) if take is not None else [texts[int(i)] for i in indices]


def _training_sentences(parts: Sequence[Sequence[str]], limit: int, seed: int) -> Iterator[str]:
    """At most ``limit`` sentences of the parts (concatenated), sampled reproducibly and streamed in
    chunks, so a corpus of any size is never held in memory; empty ones are skipped (nothing to learn)."""
    sizes = [len(texts) for texts in parts]
    chosen = sample_indices(sum(sizes), limit, seed)
    offset = 0
    for texts, size in zip(parts, sizes, strict=True):
        if chosen is None:
            indices = np.arange(size)
        else:
            indices = chosen[(chosen >= offset) & (chosen < offset + size)] - offset
        offset += size
        for start in range(0, indices.size, _SAMPLE_CHUNK):
            yield from (text for text in _take(texts, indices[start : start + _SAMPLE_CHUNK]) if text.strip())


def _train_model_proto(parts: Sequence[Sequence[str]], config: SubwordConfig) -> bytes:
    """Train a model on a sample of the parts' sentences (see :func:`_training_sentences`); its proto."""
    options: dict[str, object] = {
        "model_type": config.model_type,
        "vocab_size": config.vocab_size,
        "character_coverage": config.character_coverage,
        "max_sentence_length": config.max_sentence_length,
        "input_sentence_size": config.input_sentence_size,
        "shuffle_input_sentence": True,
        "normalization_rule_name": config.normalization_rule_name,
        "num_threads": os.cpu_count() or 1,
        "pad_id": PAD_ID,
        "unk_id": UNK_ID,
        "bos_id": BOS_ID,
        "eos_id": EOS_ID,
        "minloglevel": 2,  # keep sentencepiece's verbose training log quiet
    }
    if config.user_defined_symbols:
        options["user_defined_symbols"] = list(config.user_defined_symbols)
    if config.model_type == "unigram":
        options["hard_vocab_limit"] = False  # small corpora: shrink the vocabulary instead of failing
    spm.set_random_generator_seed(config.seed)
    writer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=_training_sentences(parts, config.input_sentence_size, config.seed),
            model_writer=writer,
            **options,
        )
    except RuntimeError as error:
        raise TokenizerError(
            f"sentencepiece could not train a {config.model_type} model with vocab_size={config.vocab_size} "
            f"on {sum(map(len, parts))} sentences: {error}"
        ) from error
    return writer.getvalue()


def _publish_once(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` unless another process published it first; readers never see a partial file.

    The file is written under a temporary name and hard-linked into place: unlike a rename, the link fails
    when ``path`` already exists, so the first model published is the one every process loads (two
    sentencepiece trainings of the same corpus are not guaranteed to give identical models).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".spm-tmp-") as tmp_dir:
        tmp_path = Path(tmp_dir) / path.name
        with open(tmp_path, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp_path, path)
        except FileExistsError:  # another process published first: theirs (and its checksum) stays
            return
        except OSError:  # a file system without hard links: fall back to an atomic rename
            os.replace(tmp_path, path)
    with atomic_write(_checksum_path(path), "w") as handle:  # after the model: readers check it if present
        handle.write(hashlib.sha256(data).hexdigest() + "\n")


def _checksum_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _load_checked(path: Path) -> Tokenizer:
    """A cached model, checked against the SHA-256 written beside it (when there is one)."""
    checksum = _checksum_path(path)
    if checksum.is_file() and checksum.read_text().strip() != file_sha256(path):
        raise TokenizerError(f"{path} does not match its checksum {checksum}")
    return Tokenizer.from_file(path)


def _train_or_load_one(
    parts: Sequence[Sequence[str]], config: SubwordConfig, cache_dir: Path, corpus_key: str, side: str
) -> Tokenizer:
    """Load the cached model; train it first on the node's first process, wait for it on the others."""
    path = _model_path(cache_dir, config, corpus_key, side, parts)
    if path.is_file():
        try:
            return _load_checked(path)
        except (TokenizerError, RuntimeError, OSError) as err:  # truncated, empty, overwritten
            if not launched_as_local_zero():
                raise TokenizerError(f"cached tokenizer {path} is unreadable ({err})") from err
            aside = move_aside(path)
            _checksum_path(path).unlink(missing_ok=True)
            log.warning(
                "cached tokenizer %s is unreadable (%s): moved to %s, training it again", path, err, aside
            )
    if launched_as_local_zero():
        _publish_once(path, _train_model_proto(parts, config))
    else:
        wait_for_file(path)
    return _load_checked(path)


def train_or_load(
    *,
    src_texts: Sequence[str],
    tgt_texts: Sequence[str],
    config: SubwordConfig,
    cache_dir: str | os.PathLike[str],
    corpus_key: str,
) -> tuple[Tokenizer, Tokenizer]:
    """Source and target tokenizers trained on the *training* texts, cached in ``cache_dir``.

    The cache file name hashes ``config``, ``corpus_key`` and the texts themselves, so a changed
    setting or corpus trains a new model while an unchanged one is loaded without training. The texts
    may be lists or Arrow-backed :class:`app.data.corpus.TextColumn` views (nothing is copied); training
    reads at most ``config.input_sentence_size`` of them, drawn with ``config.seed``.
    With ``config.joint`` one model is trained on both sides and returned twice (the same object).
    """
    cache_path = Path(cache_dir)
    if config.joint:
        joint = _train_or_load_one([src_texts, tgt_texts], config, cache_path, corpus_key, "joint")
        return joint, joint
    src = _train_or_load_one([src_texts], config, cache_path, corpus_key, "src")
    tgt = _train_or_load_one([tgt_texts], config, cache_path, corpus_key, "tgt")
    return src, tgt
