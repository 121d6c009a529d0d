"""Where the files of a tagged (multilingual) run's directions are, and its sentencepiece sample.

Where each direction's files are:

* ``data.pairs`` (any corpus, ``data=custom``): ``{de-en: {train: {src, tgt}, valid: {...}, test: {...}}}``;
* ``data.lang_files`` (a multi-way parallel corpus such as Multi30k): one path pattern per split with a
  ``{lang}`` field, ``{train: data/multi30k/train.{lang}, ...}``; a direction's sides fill it in.

:class:`app.data.corpora.Corpora` opens them, tags each source with its target language and
concatenates every split's directions in the order of ``data.directions``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from app.data.corpus import CorpusError, TextColumn, open_lines
from app.data.encoded import text_column
from app.data.multilingual import parse_direction

SPLITS = ("train", "valid", "test")


def direction_files(data: Mapping[str, Any], direction: str) -> dict[str, dict[str, str]]:
    """``{split: {"src": path, "tgt": path}}`` of one direction (``data.pairs``, else ``data.lang_files``)."""
    src, tgt = parse_direction(direction)
    pairs = data.get("pairs")
    if pairs:
        if direction not in pairs:
            raise CorpusError(f"data.pairs has no {direction!r}; it has {', '.join(pairs)}")
        missing = [split for split in SPLITS if split not in pairs[direction]]
        if missing:
            raise CorpusError(
                f"data.pairs.{direction} lacks {missing}; give train, valid and test {{src, tgt}}"
            )
        return {split: dict(pairs[direction][split]) for split in SPLITS}
    patterns = data.get("lang_files")
    if not patterns:
        raise CorpusError(
            "data.directions needs the files of each direction: data.pairs "
            "({de-en: {train: {src, tgt}, valid: ..., test: ...}}) or data.lang_files "
            "(a {lang} pattern per split)"
        )
    return {
        split: {"src": patterns[split].format(lang=src), "tgt": patterns[split].format(lang=tgt)}
        for split in SPLITS
    }


def language_samples(
    data: Mapping[str, Any], directions: Sequence[str], limit: int, seed: int
) -> list[list[str]]:
    """The sentencepiece training texts: per language, at most ``limit / languages`` sentences drawn from
    the (untagged) training files in that language, so that no language fills the sample by its size.

    A file shared by several directions (a multi-way corpus) counts once.
    """
    files: dict[str, list[str]] = {}
    for direction in directions:
        train = direction_files(data, direction)["train"]
        for lang, side in zip(parse_direction(direction), ("src", "tgt"), strict=True):
            if train[side] not in files.setdefault(lang, []):
                files[lang].append(train[side])
    share = max(limit // len(files), 1)
    rng = np.random.default_rng(seed)
    samples = []
    for lang in sorted(files):
        columns = [_column(path, data.get("cache_dir")) for path in files[lang]]
        total = sum(len(column) for column in columns)
        chosen = np.arange(total) if total <= share else np.sort(rng.choice(total, size=share, replace=False))
        texts, offset = [], 0
        for column in columns:
            inside = chosen[(chosen >= offset) & (chosen < offset + len(column))] - offset
            texts.extend(column.take(inside))
            offset += len(column)
        samples.append(texts)
    return samples


def _column(path: str, cache_dir: str | None) -> TextColumn:
    return text_column(open_lines(path, cache_dir=cache_dir), "text")
