r"""Reading line-aligned parallel corpora through Hugging Face ``datasets``.

Everything goes through ``datasets.load_dataset`` so that corpora are converted to Arrow once and cached
(the cache is keyed by the data files, including their modification time, so an edited file is re-read;
a cache file cut short is rebuilt: :mod:`app.data.hf_cache`).

Line semantics: one example per line, empty lines are examples too (a parallel corpus must keep them so
that both sides stay aligned). Only the line terminator is removed; leading and trailing spaces are
kept. ``datasets`` opens text files with Python's universal-newline mode, so ``\n``, ``\r\n`` and a
lone ``\r`` all end a line -- exactly what iterating over ``open(path, encoding="utf-8")`` yields.

Two levels: ``open_*`` return memory-mapped ``datasets.Dataset`` objects with ``src`` / ``tgt`` string
columns (what training uses: a corpus of millions of lines never becomes Python objects), and
``read_*`` / ``load_hub_parallel`` materialise them as :class:`ParallelText` lists (small evaluation sets,
tests). :class:`TextColumn` lets list-minded code (the tokenizer trainer) index and hash an Arrow column.
"""

from __future__ import annotations

import gzip
import hashlib
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import datasets
import numpy as np
import pyarrow as pa

from app.data.hf_cache import load_dataset_healed

__all__ = [
    "CorpusError",
    "FilterCounts",
    "ParallelText",
    "TextColumn",
    "TextDigest",
    "filter_pairs",
    "keep_mask",
    "load_hub_parallel",
    "open_hub_parallel",
    "open_lines",
    "open_parallel",
    "read_lines",
    "read_parallel",
    "to_parallel_text",
]

_GZIP_MAGIC = b"\x1f\x8b"


class CorpusError(ValueError):
    """A corpus is malformed or requested wrongly (misaligned files, unknown column, ...)."""


@dataclass(frozen=True)
class ParallelText:
    """Source and target sentences; ``src[i]`` translates to ``tgt[i]``."""

    src: list[str]
    tgt: list[str]

    def __post_init__(self) -> None:
        if len(self.src) != len(self.tgt):
            raise CorpusError(
                f"parallel text differs in length: {len(self.src)} source vs {len(self.tgt)} target"
            )

    def __len__(self) -> int:
        return len(self.src)


def _is_empty_text_file(path: Path) -> bool:
    """Whether the (possibly gzipped) file holds no text at all.

    ``datasets``' text builder produces no table for an empty file and then fails with "corresponds to
    no data", so empty files are detected up front and read as zero lines.
    """
    with path.open("rb") as raw:
        head = raw.read(2)
    if not head:
        return True
    if head != _GZIP_MAGIC:
        return False
    with gzip.open(path, "rb") as unzipped:
        return not unzipped.read(1)


def _require_file(path: str | os.PathLike[str]) -> Path:
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_file():
        raise CorpusError(f"corpus file not found: {path}")
    return resolved


def _first_invalid_utf8_line(path: Path) -> tuple[int, UnicodeDecodeError] | None:
    """The 1-based number of the first line that is not valid UTF-8, streamed (never the whole file)."""
    opener = gzip.open if _is_gzip(path) else open
    with opener(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as error:
                return number, error
    return None


def _is_gzip(path: Path) -> bool:
    with path.open("rb") as raw:
        return raw.read(2) == _GZIP_MAGIC


def _empty_text_dataset() -> datasets.Dataset:
    return datasets.Dataset.from_dict(
        {"text": []}, features=datasets.Features({"text": datasets.Value("string")})
    )


def open_lines(
    path: str | os.PathLike[str], *, cache_dir: str | os.PathLike[str] | None = None
) -> datasets.Dataset:
    """A plain or gzipped UTF-8 text file as a memory-mapped dataset with one ``text`` row per line.

    The conversion to Arrow is cached by ``datasets`` (keyed by the file, its size and modification time);
    a line that is not valid UTF-8 raises :class:`CorpusError` naming the file and the line number.
    """
    resolved = _require_file(path)
    if _is_empty_text_file(resolved):
        return _empty_text_dataset()
    try:
        return load_dataset_healed(
            "text",
            data_files=str(resolved),
            split="train",
            sample_by="line",
            keep_linebreaks=False,
            cache_dir=None if cache_dir is None else str(cache_dir),
        )
    except datasets.exceptions.DatasetGenerationError as error:
        if not isinstance(error.__cause__, UnicodeDecodeError):
            raise
        found = _first_invalid_utf8_line(resolved)
        where = f"line {found[0]} ({found[1].reason})" if found else "an unknown line"
        raise CorpusError(f"{path}: {where} is not valid UTF-8") from error


def read_lines(path: str | os.PathLike[str], *, cache_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """Read a plain or gzipped UTF-8 text file as one string per line, via ``datasets``' text loader.

    The line count equals that of ``open(path)`` iteration: empty lines are kept and a missing final
    newline does not lose the last line. ``cache_dir`` overrides the ``datasets`` cache location.
    """
    return open_lines(path, cache_dir=cache_dir).with_format("arrow")["text"].to_pylist()


def open_parallel(
    src_path: str | os.PathLike[str],
    tgt_path: str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
) -> datasets.Dataset:
    """Two line-aligned files as one memory-mapped dataset with ``src`` and ``tgt`` string columns.

    Raises :class:`CorpusError` naming both files and their line counts if the counts differ (the counts
    come from the Arrow tables' metadata; no side is read into memory).
    """
    src = open_lines(src_path, cache_dir=cache_dir)
    tgt = open_lines(tgt_path, cache_dir=cache_dir)
    if src.num_rows != tgt.num_rows:
        raise CorpusError(
            f"parallel files differ in length: {src_path} has {src.num_rows} lines, "
            f"{tgt_path} has {tgt.num_rows} lines"
        )
    return datasets.concatenate_datasets(
        [src.rename_column("text", "src"), tgt.rename_column("text", "tgt")], axis=1
    )


def to_parallel_text(dataset: datasets.Dataset) -> ParallelText:
    """Materialise a ``src`` / ``tgt`` dataset as Python lists (for small sets: validation, test)."""
    table = dataset.with_format("arrow")
    return ParallelText(src=table["src"].to_pylist(), tgt=table["tgt"].to_pylist())


def read_parallel(
    src_path: str | os.PathLike[str],
    tgt_path: str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
) -> ParallelText:
    """Read two line-aligned files; raise :class:`CorpusError` if their line counts differ."""
    return to_parallel_text(open_parallel(src_path, tgt_path, cache_dir=cache_dir))


def _string_column(dataset: datasets.Dataset, column: str, *, name: str) -> datasets.Dataset:
    """``column`` alone, checked to be non-null strings; a dotted name such as ``translation.de`` reaches
    into a dict column. The check reads Arrow metadata and a null count, not the values."""
    if column not in dataset.column_names and "." in column:
        dataset = dataset.flatten()
    if column not in dataset.column_names:
        raise CorpusError(f"dataset {name!r} has no column {column!r}; available: {dataset.column_names}")
    selected = dataset.select_columns([column])
    values = selected.data.column(column)
    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        raise CorpusError(f"dataset {name!r} column {column!r} holds {values.type}, expected strings")
    if values.null_count:
        row = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
        raise CorpusError(f"dataset {name!r} column {column!r} row {row} is null, expected a string")
    return selected


def open_hub_parallel(
    name: str,
    *,
    split: str,
    src_column: str,
    tgt_column: str,
    config: str | None = None,
    data_files: Any = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> datasets.Dataset:
    """A parallel split from ``datasets.load_dataset`` (hub name, local script/dir or a format name) as a
    memory-mapped dataset with ``src`` and ``tgt`` string columns."""
    dataset = load_dataset_healed(
        name,
        config,
        split=split,
        data_files=data_files,
        cache_dir=None if cache_dir is None else str(cache_dir),
    )
    if not isinstance(dataset, datasets.Dataset):
        raise CorpusError(
            f"dataset {name!r} split {split!r} did not load as a single split: {type(dataset).__name__}"
        )
    src = _string_column(dataset, src_column, name=name).rename_column(src_column, "src")
    tgt = _string_column(dataset, tgt_column, name=name).rename_column(tgt_column, "tgt")
    return datasets.concatenate_datasets([src, tgt], axis=1)


def load_hub_parallel(
    name: str,
    *,
    split: str,
    src_column: str,
    tgt_column: str,
    config: str | None = None,
    data_files: Any = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> ParallelText:
    """Load a parallel split with ``datasets.load_dataset`` (hub name, local script/dir or a format name).

    Examples: ``load_hub_parallel("bentrevett/multi30k", split="train", src_column="de", tgt_column="en")``
    or, offline, ``load_hub_parallel("json", data_files="pairs.jsonl", split="train",
    src_column="translation.de", tgt_column="translation.en")``.
    """
    dataset = open_hub_parallel(
        name,
        split=split,
        src_column=src_column,
        tgt_column=tgt_column,
        config=config,
        data_files=data_files,
        cache_dir=cache_dir,
    )
    return to_parallel_text(dataset)


class TextColumn(Sequence[str]):
    """A read-only, list-like view of an Arrow string column (memory-mapped; nothing is copied).

    ``take`` fetches many rows at once (what the sentencepiece sampler uses) and
    :meth:`update_digest` hashes the column as :class:`TextDigest` hashes the equivalent ``list[str]``.
    """

    def __init__(self, column: pa.ChunkedArray | pa.Array) -> None:
        self._column = column if isinstance(column, pa.ChunkedArray) else pa.chunked_array([column])

    def __len__(self) -> int:
        return len(self._column)

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...
    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return self._column[index].to_pylist()
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} texts")
        return self._column[index].as_py()

    def __iter__(self) -> Iterator[str]:
        for chunk in self._column.chunks:
            yield from chunk.to_pylist()

    def take(self, indices: np.ndarray) -> list[str]:
        """The texts at ``indices`` (any order), fetched in one Arrow call."""
        return self._column.take(pa.array(np.asarray(indices, dtype=np.int64))).to_pylist()

    def update_digest(self, digest: TextDigest) -> None:
        """Feed every text into ``digest`` straight from the Arrow buffers (no per-text Python objects)."""
        for chunk in self._column.chunks:
            digest.update_arrow(chunk)


class TextDigest:
    """Content hash of a sequence of texts that is the same for a ``list[str]`` and an Arrow column.

    Two SHA-256 streams: one over the UTF-8 bytes of all texts, one over their byte lengths (int64 LE),
    so line boundaries count. Hashing an Arrow column feeds whole buffers, about as fast as reading them.
    """

    def __init__(self) -> None:
        self._data, self._lengths = hashlib.sha256(), hashlib.sha256()

    def update_texts(self, texts: Iterable[str]) -> None:
        for text in texts:
            data = text.encode("utf-8")
            self._lengths.update(len(data).to_bytes(8, "little"))
            self._data.update(data)

    def update_arrow(self, chunk: pa.Array) -> None:
        chunk = chunk.cast(pa.large_string())  # int64 offsets whatever the column's string type
        if not len(chunk):
            return
        offsets = np.frombuffer(chunk.buffers()[1], dtype="<i8")[chunk.offset : chunk.offset + len(chunk) + 1]
        self._lengths.update(np.diff(offsets).astype("<i8").tobytes())
        data = chunk.buffers()[2]
        if data is not None:
            self._data.update(memoryview(data)[int(offsets[0]) : int(offsets[-1])])

    def hexdigest(self) -> str:
        return hashlib.sha256(self._lengths.digest() + self._data.digest()).hexdigest()


@dataclass(frozen=True)
class FilterCounts:
    """How many training pairs a filter kept and why the others were dropped."""

    kept: int
    empty_or_long: int  # a side is empty or longer than max_len subwords
    ratio: int  # otherwise dropped: the longer side is more than max_ratio times the shorter

    @property
    def dropped(self) -> int:
        return self.empty_or_long + self.ratio


def keep_mask(
    src_lengths: np.ndarray, tgt_lengths: np.ndarray, *, max_len: int, max_ratio: float | None = None
) -> tuple[np.ndarray, FilterCounts]:
    """Which training pairs to keep, from their subword counts (vectorised; millions of pairs in ms).

    A pair is kept when both sides are non-empty and at most ``max_len`` long and, with ``max_ratio``,
    the longer side is at most ``max_ratio`` times the shorter one.
    """
    if max_len < 1:
        raise CorpusError(f"max_len must be >= 1, got {max_len}")
    if max_ratio is not None and max_ratio < 1:
        raise CorpusError(f"max_ratio must be >= 1 or null, got {max_ratio}")
    src_lengths, tgt_lengths = np.asarray(src_lengths), np.asarray(tgt_lengths)
    if src_lengths.shape != tgt_lengths.shape:
        raise CorpusError(
            f"cannot filter pairs: {src_lengths.size} source vs {tgt_lengths.size} target sequences"
        )
    shorter, longer = np.minimum(src_lengths, tgt_lengths), np.maximum(src_lengths, tgt_lengths)
    in_range = (shorter > 0) & (longer <= max_len)
    keep = in_range if max_ratio is None else in_range & (longer <= max_ratio * shorter)
    kept = int(keep.sum())
    counts = FilterCounts(kept=kept, empty_or_long=int((~in_range).sum()), ratio=int(in_range.sum()) - kept)
    return keep, counts


def filter_pairs(
    src_ids: Sequence[Sequence[int]],
    tgt_ids: Sequence[Sequence[int]],
    *,
    max_len: int,
) -> tuple[list[int], int]:
    """Indices of the pairs to keep for *training*, and how many were dropped (see :func:`keep_mask`).

    Only the training split is filtered: validation and test sets are always used in full, so that scores
    are comparable with published numbers (a too-long evaluation sentence is truncated instead).
    """
    if len(src_ids) != len(tgt_ids):
        raise CorpusError(f"cannot filter pairs: {len(src_ids)} source vs {len(tgt_ids)} target sequences")
    keep, counts = keep_mask(
        np.fromiter(map(len, src_ids), dtype=np.int64, count=len(src_ids)),
        np.fromiter(map(len, tgt_ids), dtype=np.int64, count=len(tgt_ids)),
        max_len=max_len,
    )
    return np.flatnonzero(keep).tolist(), counts.dropped
