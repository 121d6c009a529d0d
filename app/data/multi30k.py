"""Fetching the Multi30k task-1 corpus (raw text) into plain one-sentence-per-line files.

Output layout: ``{out_dir}/{split}.{lang}`` (e.g. ``data/multi30k/train.de``), decompressed and
byte-identical to the official files. Sources are either a local directory holding the official
``{split}.{lang}.gz`` (or already decompressed ``{split}.{lang}``) files, or the official GitHub URL.
"""

from __future__ import annotations

import gzip
import io
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "EXPECTED_LINES",
    "FIXTURE_LINES",
    "LANGS",
    "SPLITS",
    "URL_TEMPLATE",
    "DownloadError",
    "Multi30kError",
    "SplitSummary",
    "count_lines",
    "prepare_multi30k",
    "write_slice",
]

SPLITS = ("train", "val", "test_2016_flickr")
LANGS = ("en", "de", "fr", "cs")
URL_TEMPLATE = "https://github.com/multi30k/dataset/raw/master/data/task1/raw/{split}.{lang}.gz"
EXPECTED_LINES = {"train": 29_000, "val": 1_014, "test_2016_flickr": 1_000}
"""Official sentence counts, used to catch truncated downloads or wrong source files."""
FIXTURE_LINES = {"train": 3_000, "val": 300, "test_2016_flickr": 200}
"""Sentences per split of the test fixture (tests/fixtures/multi30k): the first lines of the release."""

_GZIP_MAGIC = b"\x1f\x8b"
_DOWNLOAD_TIMEOUT_S = 60


class Multi30kError(ValueError):
    """Bad arguments, missing source files or corpus files that do not match the official ones."""


class DownloadError(OSError):
    """The official file could not be downloaded (e.g. no network access)."""


@dataclass(frozen=True)
class SplitSummary:
    """Result for one split: its line count (equal for all languages) and how many files were (re)written."""

    split: str
    lines: int
    written: int
    skipped: int


def count_lines(data: bytes) -> int:
    """Number of lines, counting a final line without newline (like iterating over a text file)."""
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def _maybe_decompress(data: bytes) -> bytes:
    return gzip.decompress(data) if data.startswith(_GZIP_MAGIC) else data


def _read_local(source: Path, split: str, lang: str) -> bytes:
    """The decompressed content of ``{split}.{lang}.gz`` (preferred) or ``{split}.{lang}`` in ``source``."""
    for name in (f"{split}.{lang}.gz", f"{split}.{lang}"):
        candidate = source / name
        if candidate.is_file():
            return _maybe_decompress(candidate.read_bytes())
    raise Multi30kError(f"neither {split}.{lang}.gz nor {split}.{lang} found in source directory {source}")


def _download(url: str) -> bytes:
    """Fetch ``url`` with urllib; a network failure becomes a :class:`DownloadError` naming ``source``."""
    try:
        with urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT_S) as response:
            return response.read()
    except (urllib.error.URLError, OSError) as error:
        raise DownloadError(
            f"could not download {url}: {error}. Without network access, pass a local directory holding "
            "the official <split>.<lang>.gz files as source (scripts/prepare_data.py --source DIR)."
        ) from error


def _fetch(split: str, lang: str, *, source: Path | None, url_template: str) -> bytes:
    if source is not None:
        return _read_local(source, split, lang)
    return _maybe_decompress(_download(url_template.format(split=split, lang=lang)))


def _write_atomically(path: Path, data: bytes) -> None:
    """Write via a temporary file in the same directory, so an interrupted run leaves no partial file."""
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as tmp_file:
            tmp_file.write(data)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def _validate_names(langs: Sequence[str], splits: Sequence[str]) -> None:
    if not langs:
        raise Multi30kError("at least one language is required")
    unknown_langs = sorted(set(langs) - set(LANGS))
    if unknown_langs:
        raise Multi30kError(f"unknown Multi30k language(s) {unknown_langs}; valid: {list(LANGS)}")
    unknown_splits = sorted(set(splits) - set(SPLITS))
    if unknown_splits:
        raise Multi30kError(f"unknown Multi30k split(s) {unknown_splits}; valid: {list(SPLITS)}")


def _prepare_split(
    out_dir: Path,
    split: str,
    langs: Sequence[str],
    *,
    source: Path | None,
    force: bool,
    url_template: str,
    expected_lines: Mapping[str, int] | None,
) -> SplitSummary:
    """Write all languages of one split, skipping identical existing files, and check line counts."""
    counts: dict[str, int] = {}
    written = 0
    for lang in langs:
        target = out_dir / f"{split}.{lang}"
        if not force and source is None and target.is_file():
            data = target.read_bytes()  # no cheap way to compare with the remote file: trust it
        else:
            data = _fetch(split, lang, source=source, url_template=url_template)
            if force or not target.is_file() or target.read_bytes() != data:
                _write_atomically(target, data)
                written += 1
        counts[lang] = count_lines(data)
    if len(set(counts.values())) != 1:
        raise Multi30kError(f"split {split!r}: languages differ in line count: {counts}")
    lines = next(iter(counts.values()))
    if expected_lines is not None and lines != expected_lines[split]:
        raise Multi30kError(f"split {split!r} has {lines} lines, expected {expected_lines[split]}")
    return SplitSummary(split=split, lines=lines, written=written, skipped=len(langs) - written)


def prepare_multi30k(
    out_dir: str | os.PathLike[str],
    *,
    source: str | os.PathLike[str] | None = None,
    langs: Sequence[str] = LANGS,
    splits: Sequence[str] = SPLITS,
    force: bool = False,
    url_template: str = URL_TEMPLATE,
    expected_lines: Mapping[str, int] | None = EXPECTED_LINES,
) -> list[SplitSummary]:
    """Create ``{out_dir}/{split}.{lang}`` for every split and language; idempotent.

    With ``source`` the files are decompressed from that directory and an existing output file is
    rewritten only if its content differs; without it they are downloaded from ``url_template`` and
    existing output files are kept as they are (``force=True`` re-fetches and rewrites everything).
    Raises :class:`Multi30kError` if the languages of a split differ in line count or the count is not
    ``expected_lines[split]`` (the official counts; None accepts any count, e.g. for a slice such as
    the test fixture), and :class:`DownloadError` when a download fails.
    """
    _validate_names(langs, splits)
    source_dir = None if source is None else Path(source)
    if source_dir is not None and not source_dir.is_dir():
        raise Multi30kError(f"source directory does not exist: {source_dir}")
    target_dir = Path(out_dir)
    target_dir.mkdir(parents=True, exist_ok=True)
    return [
        _prepare_split(
            target_dir,
            split,
            langs,
            source=source_dir,
            force=force,
            url_template=url_template,
            expected_lines=expected_lines,
        )
        for split in splits
    ]


def write_slice(
    source: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    lines: Mapping[str, int] = FIXTURE_LINES,
    langs: Sequence[str] = LANGS,
) -> dict[str, int]:
    """Write the first ``lines[split]`` sentences of every split and language of the release in ``source``
    as ``{out_dir}/{split}.{lang}.gz``; returns the bytes written per file name.

    The first lines, not a random sample: a slice of a slice is the same slice, so tests may cut their
    own smaller corpora from it and get what they got from the release. The gzip header carries no
    time stamp or file name (``mtime=0``), so the same input always gives byte-identical files.
    Raises :class:`Multi30kError` for unknown names or a split with fewer lines than asked for.
    """
    _validate_names(langs, list(lines))
    source_dir, target_dir = Path(source), Path(out_dir)
    if not source_dir.is_dir():
        raise Multi30kError(f"source directory does not exist: {source_dir}")
    target_dir.mkdir(parents=True, exist_ok=True)
    sizes: dict[str, int] = {}
    for split, count in lines.items():
        for lang in langs:
            text = _read_local(source_dir, split, lang)
            head = io.BytesIO(text).readlines()[:count]  # split at b"\n" only, as count_lines does
            if len(head) < count:
                raise Multi30kError(
                    f"{split}.{lang} in {source_dir} has {len(head)} lines, fewer than {count}"
                )
            name = f"{split}.{lang}.gz"
            data = gzip.compress(b"".join(head), compresslevel=9, mtime=0)
            _write_atomically(target_dir / name, data)
            sizes[name] = len(data)
    return sizes
