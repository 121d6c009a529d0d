"""Tokenized splits in Arrow: token ids and lengths as memory-mapped columns, built once and cached.

:func:`encode_split` tokenizes a ``src`` / ``tgt`` text dataset with ``datasets.Dataset.map`` (batched,
in ``num_proc`` processes) into four columns -- ``src_ids`` and ``tgt_ids`` (int32 lists, no specials),
``src_len`` and ``tgt_len`` (int32) -- written under ``<cache_dir>/<key>/``. The key hashes the corpus
content and both tokenizer models, so a cache built from another corpus or tokenizer is never reused,
and an unchanged one loads in the time it takes to memory-map its files.

:class:`EncodedPairs` serves training examples from that table: single examples through ``__getitem__``
and whole batches through ``__getitems__`` (slices of the memory-mapped id columns), never holding
the corpus as Python objects. Every DataLoader worker and every DDP rank maps the same files, so the operating
system keeps one copy of the pages however many processes read them.

A cache heals: its manifest records each file's size and SHA-256 (every file is fsynced before the
manifest is written, and the manifest before the directory is renamed into place;
:mod:`app.data.cache_manifest`), and an entry that fails to load or to match its manifest (a missing or
malformed manifest, a truncated or rewritten file, columns of another type) is moved aside
(``<key>.corrupt-<time>``) and rebuilt, with one warning naming it. Checking costs one read of the files
per load (about a second per GB).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
from torch.utils.data import Dataset

from app.data.cache_manifest import MANIFEST, CacheError, read_manifest, write_manifest
from app.data.corpus import TextColumn, TextDigest
from app.data.tokenizer import SubwordSampling, Tokenizer
from app.io import fsync_file, move_aside
from app.ranks import launched_as_local_zero, wait_for_file

__all__ = [
    "FORMAT_VERSION",
    "CacheError",
    "EncodedPairs",
    "ResampledPairs",
    "encode_split",
    "encoding_key",
    "text_column",
]

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
"""Bumped whenever the cached columns change meaning; part of every cache key."""

_FEATURES = datasets.Features(
    {
        "src_ids": datasets.List(datasets.Value("int32")),
        "tgt_ids": datasets.List(datasets.Value("int32")),
        "src_len": datasets.Value("int32"),
        "tgt_len": datasets.Value("int32"),
    }
)


def text_column(dataset: datasets.Dataset, name: str) -> TextColumn:
    """The string column ``name`` of ``dataset`` as a list-like view of its memory-mapped Arrow data."""
    if dataset._indices is not None:  # a select()/shuffle() view: the table rows are not the dataset's rows
        dataset = dataset.flatten_indices()
    return TextColumn(dataset.data.column(name))


def encoding_key(texts: datasets.Dataset, src_tokenizer: Tokenizer, tgt_tokenizer: Tokenizer) -> str:
    """Hash of everything the encoded columns depend on: both sides' texts, both models, the format."""
    content = hashlib.sha256(f"encoded-v{FORMAT_VERSION}".encode())
    for side in ("src", "tgt"):
        digest = TextDigest()
        text_column(texts, side).update_digest(digest)
        content.update(digest.hexdigest().encode())
    for tokenizer in (src_tokenizer, tgt_tokenizer):
        content.update(hashlib.sha256(tokenizer.to_bytes()).hexdigest().encode())
    return content.hexdigest()[:24]


class _EncodeBatch:
    """The ``Dataset.map`` function: a batch of texts to ids and lengths.

    Holds the models as bytes and builds the processors lazily, so it pickles small into the
    ``num_proc`` worker processes.
    """

    def __init__(self, src_tokenizer: Tokenizer, tgt_tokenizer: Tokenizer) -> None:
        self._models = (src_tokenizer.to_bytes(), tgt_tokenizer.to_bytes())
        self._tokenizers: tuple[Tokenizer, Tokenizer] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"_models": self._models, "_tokenizers": None}

    def __call__(self, batch: dict[str, list[str]]) -> dict[str, list[Any]]:
        if self._tokenizers is None:
            src_model, tgt_model = self._models
            src = Tokenizer.from_bytes(src_model)
            self._tokenizers = (src, src if tgt_model == src_model else Tokenizer.from_bytes(tgt_model))
        src_ids = self._tokenizers[0].encode(batch["src"])
        tgt_ids = self._tokenizers[1].encode(batch["tgt"])
        return {
            "src_ids": src_ids,
            "tgt_ids": tgt_ids,
            "src_len": [len(ids) for ids in src_ids],
            "tgt_len": [len(ids) for ids in tgt_ids],
        }


def encode_split(
    texts: datasets.Dataset,
    src_tokenizer: Tokenizer,
    tgt_tokenizer: Tokenizer,
    *,
    cache_dir: str | os.PathLike[str],
    num_proc: int = 1,
    name: str = "split",
) -> datasets.Dataset:
    """The tokenized ``texts`` (columns ``src_ids, tgt_ids, src_len, tgt_len``), memory-mapped from the cache.

    The first process of a node builds a missing cache (``num_proc`` tokenizing processes); the node's
    other ranks wait for its manifest, which is published last, so nobody reads a half-written cache.
    """
    if num_proc < 1:
        raise ValueError(f"data.num_proc must be >= 1, got {num_proc}")
    directory = Path(cache_dir) / encoding_key(texts, src_tokenizer, tgt_tokenizer)
    if directory.exists() or directory.is_symlink():  # published whole (manifest inside), or damaged
        try:
            return _load(directory)
        except _UNREADABLE as err:
            if not launched_as_local_zero():
                raise CacheError(
                    f"token cache {directory} is unreadable ({err}); local rank 0 rebuilds it"
                ) from err
            _heal(directory, err)
    if launched_as_local_zero():
        _build(texts, _EncodeBatch(src_tokenizer, tgt_tokenizer), directory, num_proc, name)
    else:
        wait_for_file(directory / MANIFEST)
    return _load(directory)


# What a damaged cache raises on load: a missing or truncated file (OSError, pyarrow's errors), a manifest
# that is no JSON (ValueError), one of the wrong shape, or files that do not match it (CacheError).
_UNREADABLE = (OSError, ValueError, KeyError, TypeError, pa.ArrowException, CacheError)


def _heal(directory: Path, err: Exception) -> None:
    """Move a damaged cache entry aside (kept for inspection) so that it is rebuilt, with one warning."""
    try:
        aside = move_aside(directory)
    except FileNotFoundError:  # another process on this node moved it aside first: it rebuilds too
        log.info("token cache %s was moved aside by another process", directory)
        return
    log.warning("token cache %s is unreadable (%s): moved to %s, rebuilding it", directory, err, aside)


def _build(texts: datasets.Dataset, encode: _EncodeBatch, directory: Path, num_proc: int, name: str) -> None:
    """Tokenize into a temporary directory, write its manifest, then rename it into place (atomic)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}-tmp-"))
    try:
        encoded = texts.map(
            encode,
            batched=True,
            num_proc=num_proc if num_proc > 1 and texts.num_rows > 1 else None,
            remove_columns=texts.column_names,
            features=_FEATURES,
            cache_file_name=str(tmp / "ids.arrow"),
            new_fingerprint=directory.name,
            load_from_cache_file=False,
            desc=f"tokenizing {name}",
        )
        files = [Path(entry["filename"]).name for entry in encoded.cache_files]
        write_manifest(tmp, format_version=FORMAT_VERSION, rows=encoded.num_rows, files=files)
        try:
            tmp.rename(directory)
        except OSError:  # another process published the same cache first: use theirs
            if not (directory / MANIFEST).is_file():
                raise
        fsync_file(directory.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load(directory: Path) -> datasets.Dataset:
    """The encoded split of a cache entry, after its manifest, files, columns and row count are checked."""
    manifest = read_manifest(directory, format_version=FORMAT_VERSION)
    if not manifest["files"]:  # an empty split: map writes no file
        return datasets.Dataset.from_dict({name: [] for name in _FEATURES}, features=_FEATURES)
    parts = [datasets.Dataset.from_file(str(directory / file)) for file in manifest["files"]]
    encoded = datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0]
    if encoded.features != _FEATURES:  # another column set or type (int64 ids): not what batches expect
        raise CacheError(f"token cache {directory} holds columns {encoded.features}, not {_FEATURES}")
    if encoded.num_rows != manifest["rows"]:
        raise CacheError(
            f"token cache {directory} holds {encoded.num_rows} rows, its manifest says {manifest['rows']}"
        )
    return encoded


class _ChunkedIds:
    """Row lookup in a chunked ``list<int32>`` column: a row's ids are a numpy slice of its chunk's
    memory-mapped values, found through the chunks' start rows. Arrow's ``ChunkedArray.take`` costs
    time linear in the number of chunks (datasets writes one per 1,000 rows: 25 ms per 80-row batch at
    3M rows, against 1.8 ms at 300k); this lookup costs the same at any corpus size."""

    def __init__(self, column: pa.ChunkedArray) -> None:
        self.starts = np.cumsum([0, *(len(chunk) for chunk in column.chunks)])  # (chunks + 1,)
        self.offsets = [chunk.offsets.to_numpy() for chunk in column.chunks]  # per chunk (rows + 1,)
        self.values = [chunk.values.to_numpy() for chunk in column.chunks]  # zero-copy views

    def rows(self, rows: np.ndarray) -> list[np.ndarray]:
        """The ids of each row in ``rows`` (table positions), as read-only views."""
        chunks = np.searchsorted(self.starts, rows, side="right") - 1
        local = rows - self.starts[chunks]
        out = []
        for chunk, row in zip(chunks.tolist(), local.tolist(), strict=True):
            offsets = self.offsets[chunk]
            out.append(self.values[chunk][offsets[row] : offsets[row + 1]])
        return out


class EncodedPairs(Dataset):
    """Examples ``(index, src_ids, tgt_ids)`` of a tokenized split, read from its memory-mapped table.

    ``rows`` picks the table rows that form the split, in order (the training filter's survivors; None:
    all), and ``index`` counts positions in that selection. ``truncate`` cuts both sides to at most that
    many ids (evaluation splits are never filtered, a too-long sentence is shortened for the loss instead).
    """

    def __init__(
        self, table: datasets.Dataset, rows: np.ndarray | None = None, truncate: int | None = None
    ) -> None:
        if truncate is not None and truncate < 1:
            raise ValueError(f"truncate must be >= 1 or None, got {truncate}")
        self.table = table
        self.rows = None if rows is None else np.asarray(rows, dtype=np.int64)
        self.truncate = truncate
        self._columns: tuple[_ChunkedIds, _ChunkedIds] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_columns": None}  # Arrow columns are re-mapped, not pickled, in workers

    def __len__(self) -> int:
        return self.table.num_rows if self.rows is None else int(self.rows.size)

    def _id_columns(self) -> tuple[_ChunkedIds, _ChunkedIds]:
        if self._columns is None:
            data = self.table.data
            self._columns = (_ChunkedIds(data.column("src_ids")), _ChunkedIds(data.column("tgt_ids")))
        return self._columns

    def __getitem__(self, index: int) -> tuple[int, np.ndarray, np.ndarray]:
        (example,) = self.__getitems__([index])
        return example

    def _locate(self, indices: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Example positions (negative ones counted from the end) and their table rows, range-checked."""
        positions = np.asarray(indices, dtype=np.int64)
        if positions.size and (positions.min() < -len(self) or positions.max() >= len(self)):
            raise IndexError(
                f"indices out of range for {len(self)} examples: {positions.min()}..{positions.max()}"
            )
        positions = positions % max(len(self), 1)
        return positions, (positions if self.rows is None else self.rows[positions])

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """A whole batch at once (DataLoader calls this with the sampler's batch): ids are views of the
        memory-mapped table, copied only when the batch is padded."""
        positions, rows = self._locate(indices)
        src_column, tgt_column = self._id_columns()
        src, tgt = src_column.rows(rows), tgt_column.rows(rows)
        if self.truncate is not None:
            src, tgt = [s[: self.truncate] for s in src], [t[: self.truncate] for t in tgt]
        return list(zip(positions.tolist(), src, tgt, strict=True))

    def side_lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """Subword counts of the source and target sides, after truncation, as int64 arrays."""
        data = self.table.data
        src = data.column("src_len").to_numpy().astype(np.int64)
        tgt = data.column("tgt_len").to_numpy().astype(np.int64)
        if self.rows is not None:
            src, tgt = src[self.rows], tgt[self.rows]
        if self.truncate is not None:
            src, tgt = np.minimum(src, self.truncate), np.minimum(tgt, self.truncate)
        return src, tgt

    def lengths(self) -> np.ndarray:
        """Per example, the longer side including the special token added on each side (for batching)."""
        src, tgt = self.side_lengths()
        return np.maximum(src, tgt) + 1

    @property
    def src(self) -> _IdsView:
        """Source ids of every example, as a lazy read-only sequence of arrays."""
        return _IdsView(self, 1)

    @property
    def tgt(self) -> _IdsView:
        """Target ids of every example, as a lazy read-only sequence of arrays."""
        return _IdsView(self, 2)


class ResampledPairs(EncodedPairs):
    """Training pairs whose ids are a fresh sampled segmentation of their text in every batch served
    (subword regularization; see :class:`app.data.tokenizer.SubwordSampling`).

    The cached table still decides which pairs exist and how they are batched (its one-best lengths;
    sampled segmentations are a little longer, so a batch may exceed the token budget by that much).
    The draw is seeded by ``seed`` and the batch's rows, so a batch is the same in every run, in a
    DataLoader worker or not, and a resumed run trains on exactly the batches it would have. Sampled
    ids longer than ``truncate`` are cut to it (the model's positions).
    """

    def __init__(
        self,
        table: datasets.Dataset,
        texts: datasets.Dataset,
        tokenizers: tuple[Tokenizer, Tokenizer],
        sampling: SubwordSampling,
        *,
        seed: int,
        rows: np.ndarray | None = None,
        truncate: int | None = None,
    ) -> None:
        super().__init__(table, rows=rows, truncate=truncate)
        if texts.num_rows != table.num_rows:
            raise ValueError(
                f"{texts.num_rows} text pairs but {table.num_rows} encoded rows: not the same split"
            )
        self.texts, self.tokenizers, self.sampling, self.seed = texts, tokenizers, sampling, seed
        self._text_columns: tuple[TextColumn, TextColumn] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_text_columns": None}

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[int, np.ndarray, np.ndarray]]:
        positions, rows = self._locate(indices)
        if self._text_columns is None:
            self._text_columns = (text_column(self.texts, "src"), text_column(self.texts, "tgt"))
        rng = np.random.default_rng([self.seed, *rows.tolist()])
        sides = []
        for column, tokenizer in zip(self._text_columns, self.tokenizers, strict=True):
            ids = tokenizer.encode_sampled(column.take(rows), self.sampling, rng)
            sides.append([np.asarray(seq[: self.truncate], dtype=np.int32) for seq in ids])
        return list(zip(positions.tolist(), *sides, strict=True))


class _IdsView(Sequence[np.ndarray]):
    """One side of :class:`EncodedPairs` as a sequence (for inspection and tests; fetched per item)."""

    def __init__(self, pairs: EncodedPairs, field: int) -> None:
        self._pairs, self._field = pairs, field

    def __len__(self) -> int:
        return len(self._pairs)

    def __getitem__(self, index: int) -> np.ndarray:  # type: ignore[override]
        return self._pairs[index][self._field]
