"""Long inputs from a corpus of short ones: ``data.concat=K`` joins K consecutive sentence pairs.

Efficient attention kernels exist for long inputs, and Multi30k's captions are ~13 subwords long. To
measure attention where length matters without another corpus, each training, validation and test
example becomes K consecutive pairs, both sides joined by the same separator (a K=64 Multi30k example is
~900 subwords a side). A pair of blank lines marks a document boundary: groups never cross one, so a
corpus that marks its documents keeps each example inside one document (Multi30k has none, so its
groups are consecutive lines). The last group of a document may hold fewer than K pairs.

The separator is one sentencepiece piece (a user-defined symbol, see
:class:`app.data.tokenizer.SubwordConfig`), so it survives tokenization and a translation can be split
back into sentences where it kept the same number of separators as its reference
(:func:`split_at_separator`).
"""

from __future__ import annotations

import hashlib

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SEPARATOR = "<sep>"  # joins the sentences of one example; a user-defined sentencepiece symbol


def concat_pairs(dataset: datasets.Dataset, k: int, separator: str = SEPARATOR) -> datasets.Dataset:
    """Examples of ``k`` consecutive ``src`` / ``tgt`` pairs each, joined by ``" <separator> "``.

    ``k`` = 1 returns ``dataset`` itself. Blank pairs (both sides empty) end a document and are dropped.
    The result is an in-memory Arrow table: one row per group, in corpus order.
    """
    if k < 1:
        raise ValueError(f"data.concat must be >= 1 (pairs per example), got {k}")
    if k == 1:
        return dataset
    table = dataset.with_format("arrow")[:]
    src, tgt = table["src"].combine_chunks(), table["tgt"].combine_chunks()
    blank = np.logical_and(_is_blank(src), _is_blank(tgt))  # (N,) document boundaries
    kept = np.flatnonzero(~blank)  # (n,) rows that hold text
    starts = group_starts(np.cumsum(blank)[kept], k)  # (n,) True where a new example begins
    offsets = pa.array(np.r_[np.flatnonzero(starts), len(kept)].astype(np.int32))
    joiner = f" {separator} "
    columns = {
        side: pc.binary_join(pa.ListArray.from_arrays(offsets, column.take(pa.array(kept))), joiner)
        for side, column in (("src", src), ("tgt", tgt))
    }
    # The fingerprint (the cache key of every later map) follows from the input's and the grouping;
    # left to datasets, it would pickle the whole table, which fails under Python 3.12 + pyarrow 26
    fingerprint = hashlib.sha256(f"{dataset._fingerprint}|concat={k}|{separator}".encode()).hexdigest()[:16]
    return datasets.Dataset(datasets.table.InMemoryTable(pa.table(columns)), fingerprint=fingerprint)


def group_starts(document: np.ndarray, k: int) -> np.ndarray:
    """Where groups of at most ``k`` consecutive rows begin, never spanning two ``document`` ids (n,)."""
    n = len(document)
    new_document = np.r_[True, document[1:] != document[:-1]] if n else np.zeros(0, dtype=bool)
    first_row = np.maximum.accumulate(np.where(new_document, np.arange(n), 0))  # of each row's document
    return (np.arange(n) - first_row) % k == 0


def split_at_separator(text: str, separator: str = SEPARATOR) -> list[str]:
    """The sentences of one joined example (whitespace around each trimmed)."""
    return [part.strip() for part in text.split(separator)]


def _is_blank(column: pa.Array) -> np.ndarray:
    return pc.equal(pc.utf8_trim_whitespace(column), "").to_numpy(zero_copy_only=False)
