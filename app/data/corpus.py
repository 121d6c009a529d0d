r"""Reading line-aligned parallel corpora through Hugging Face ``datasets``.

Everything goes through ``datasets.load_dataset`` so that corpora are converted to Arrow once and cached
(the cache is keyed by the data files, including their modification time, so an edited file is re-read).

Line semantics: one example per line, empty lines are examples too (a parallel corpus must keep them so
that both sides stay aligned). Only the line terminator is removed; leading and trailing spaces are
kept. ``datasets`` opens text files with Python's universal-newline mode, so ``\n``, ``\r\n`` and a
lone ``\r`` all end a line -- exactly what iterating over ``open(path, encoding="utf-8")`` yields.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets

__all__ = [
    "CorpusError",
    "ParallelText",
    "filter_pairs",
    "load_hub_parallel",
    "read_lines",
    "read_parallel",
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


def read_lines(path: str | os.PathLike[str], *, cache_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """Read a plain or gzipped UTF-8 text file as one string per line, via ``datasets``' text loader.

    The line count equals that of ``open(path)`` iteration: empty lines are kept and a missing final
    newline does not lose the last line. ``cache_dir`` overrides the ``datasets`` cache location.
    """
    resolved = _require_file(path)
    if _is_empty_text_file(resolved):
        return []
    dataset = datasets.load_dataset(
        "text",
        data_files=str(resolved),
        split="train",
        sample_by="line",
        keep_linebreaks=False,
        cache_dir=None if cache_dir is None else str(cache_dir),
    )
    return dataset.with_format("arrow")["text"].to_pylist()


def read_parallel(
    src_path: str | os.PathLike[str],
    tgt_path: str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
) -> ParallelText:
    """Read two line-aligned files; raise :class:`CorpusError` if their line counts differ."""
    src = read_lines(src_path, cache_dir=cache_dir)
    tgt = read_lines(tgt_path, cache_dir=cache_dir)
    if len(src) != len(tgt):
        raise CorpusError(
            f"parallel files differ in length: {src_path} has {len(src)} lines, "
            f"{tgt_path} has {len(tgt)} lines"
        )
    return ParallelText(src=src, tgt=tgt)


def _column_strings(dataset: datasets.Dataset, column: str, *, name: str) -> list[str]:
    """Return ``column`` as strings; a dotted name such as ``translation.de`` reaches into a dict column."""
    if column not in dataset.column_names and "." in column:
        dataset = dataset.flatten()
    if column not in dataset.column_names:
        raise CorpusError(f"dataset {name!r} has no column {column!r}; available: {dataset.column_names}")
    values = dataset.select_columns([column]).with_format("arrow")[column].to_pylist()
    for row, value in enumerate(values):
        if not isinstance(value, str):
            raise CorpusError(
                f"dataset {name!r} column {column!r} row {row} is {type(value).__name__}, expected a string"
            )
    return values


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
    dataset = datasets.load_dataset(
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
    return ParallelText(
        src=_column_strings(dataset, src_column, name=name),
        tgt=_column_strings(dataset, tgt_column, name=name),
    )


def filter_pairs(
    src_ids: Sequence[Sequence[int]],
    tgt_ids: Sequence[Sequence[int]],
    *,
    max_len: int,
) -> tuple[list[int], int]:
    """Indices of the pairs to keep for *training*, and how many were dropped.

    A pair is kept when both sides are non-empty and at most ``max_len`` tokens long. Only the training
    split is filtered: validation and test sets are always used in full, so that scores are comparable
    with published numbers (a too-long evaluation sentence is truncated or handled by the model instead).
    """
    if max_len < 1:
        raise CorpusError(f"max_len must be >= 1, got {max_len}")
    if len(src_ids) != len(tgt_ids):
        raise CorpusError(f"cannot filter pairs: {len(src_ids)} source vs {len(tgt_ids)} target sequences")
    keep = [
        index
        for index, (src, tgt) in enumerate(zip(src_ids, tgt_ids, strict=True))
        if 0 < len(src) <= max_len and 0 < len(tgt) <= max_len
    ]
    return keep, len(src_ids) - len(keep)
