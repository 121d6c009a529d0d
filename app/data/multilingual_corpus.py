"""The corpora of a multilingual run: one file pair per direction and split, tagged and concatenated.

Where each direction's files are:

* ``data.pairs`` (any corpus, ``data=custom``): ``{de-en: {train: {src, tgt}, valid: {...}, test: {...}}}``;
* ``data.lang_files`` (a multi-way parallel corpus such as Multi30k): one path pattern per split with a
  ``{lang}`` field, ``{train: data/multi30k/train.{lang}, ...}``; a direction's sides fill it in.

Every split becomes the concatenation of its directions' pairs, each source tagged with its target
language (:func:`app.data.multilingual.tagged_split`), in the order of ``data.directions``; the
``direction`` column tells them apart (validation and test scores per direction, temperature sampling).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import datasets
import numpy as np

from app.data.corpus import CorpusError, TextColumn, open_lines, open_parallel
from app.data.encoded import text_column
from app.data.multilingual import parse_direction, tagged_split

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


def all_files(data: Mapping[str, Any], directions: Sequence[str]) -> list[str]:
    """Every file the directions read (each once), for the fetcher's check."""
    paths = {
        path
        for direction in directions
        for split in direction_files(data, direction).values()
        for path in split.values()
    }
    return sorted(paths)


def load_directions(data: Mapping[str, Any], directions: Sequence[str]) -> dict[str, datasets.Dataset]:
    """Each split as the tagged concatenation of its directions (``src``, ``tgt``, ``direction``)."""
    if data.get("concat", 1) != 1:
        raise CorpusError("data.concat > 1 and data.directions cannot be combined (one or the other)")
    if data.get("hub"):
        raise CorpusError("data.directions reads files (data.pairs or data.lang_files), not data.hub")
    cache_dir = data.get("cache_dir")
    corpora: dict[str, list[datasets.Dataset]] = {split: [] for split in SPLITS}
    for direction in directions:
        for split, files in direction_files(data, direction).items():
            pairs = open_parallel(files["src"], files["tgt"], cache_dir=cache_dir)
            corpora[split].append(tagged_split(pairs, direction))
    return {split: datasets.concatenate_datasets(parts) for split, parts in corpora.items()}


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
