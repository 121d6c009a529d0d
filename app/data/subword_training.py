"""Training SentencePiece models on a corpus sample, once: a content-keyed on-disk cache that heals.

The cache key hashes the settings, the corpus name, the side and the texts themselves, so a changed
corpus or setting trains a new model and an unchanged one is loaded. A cached model heals: its SHA-256
is written beside it (``<model>.sha256``), and a model that fails to load or to match it is moved aside
(``<model>.corrupt-<time>``) and trained again, with a warning. On a node with several ranks, the first
local rank trains and the others wait for the file.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import sentencepiece as spm

from app.data.corpus import TextColumn, TextDigest
from app.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    SubwordConfig,
    Tokenizer,
    TokenizerError,
)
from app.io import atomic_write, file_sha256, move_aside
from app.ranks import launched_as_local_zero, wait_for_file

log = logging.getLogger(__name__)
_SAMPLE_CHUNK = 10_000  # sentences fetched per Arrow call while streaming the training sample


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
    if checksum.exists() and checksum.read_text(encoding="ascii").strip() != file_sha256(path):
        raise TokenizerError(f"{path} does not match its checksum {checksum}")
    return Tokenizer.from_file(path)


def _heal(path: Path, err: Exception) -> None:
    """Move a damaged cached model aside (kept for inspection) and drop its checksum, with one warning."""
    try:
        aside = move_aside(path)
    except FileNotFoundError:  # another process on this node moved it aside first: it trains again too
        return
    checksum = _checksum_path(path)
    if checksum.is_file():
        checksum.unlink(missing_ok=True)
    elif checksum.exists() or checksum.is_symlink():  # a directory or a dangling link in its place
        move_aside(checksum)
    log.warning("cached tokenizer %s is unreadable (%s): moved to %s, training it again", path, err, aside)


def _train_or_load_one(
    parts: Sequence[Sequence[str]], config: SubwordConfig, cache_dir: Path, corpus_key: str, side: str
) -> Tokenizer:
    """Load the cached model; train it first on the node's first process, wait for it on the others."""
    path = _model_path(cache_dir, config, corpus_key, side, parts)
    if path.exists() or path.is_symlink():
        try:
            return _load_checked(path)
        # truncated, empty, overwritten, a directory in its place, a checksum that is not text
        except (TokenizerError, RuntimeError, OSError, ValueError) as err:
            if not launched_as_local_zero():
                raise TokenizerError(f"cached tokenizer {path} is unreadable ({err})") from err
            _heal(path, err)
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


def train_or_load_joint(
    parts: Sequence[Sequence[str]],
    *,
    config: SubwordConfig,
    cache_dir: str | os.PathLike[str],
    corpus_key: str,
) -> Tokenizer:
    """One model for all ``parts`` (a multilingual run's languages), cached as by :func:`train_or_load`."""
    if not config.joint:
        raise TokenizerError(
            "a multilingual run (data.directions) needs one joint model: data.subword.joint=true"
        )
    return _train_or_load_one(parts, config, Path(cache_dir), corpus_key, "joint")
