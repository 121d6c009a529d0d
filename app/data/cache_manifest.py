"""The manifest of a cache entry (a directory of files): written last, read and checked first.

A token cache (:mod:`app.data.encoded`) is published as a directory whose ``manifest.json`` records its
format, row count, files, and each file's size and SHA-256. Every file is fsynced before the manifest is
written, and the manifest before the directory is renamed into place, so a whole entry always has one.
Reading checks everything a damaged entry can get wrong: a missing manifest, one that is not JSON or not
an object (``null``, ``[]``), fields of the wrong type, file names that leave the directory, and files
whose size or checksum differ. Each raises (``OSError``, ``ValueError`` or :class:`CacheError`), so the
caller can move the entry aside and rebuild it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from app.io import file_sha256, fsync_file

MANIFEST = "manifest.json"


class CacheError(RuntimeError):
    """A cache entry that is not what its manifest says (truncated, overwritten, missing, malformed)."""


def write_manifest(directory: Path, *, format_version: int, rows: int, files: list[str]) -> None:
    """Sync ``files`` (names inside ``directory``), then write and sync the manifest that describes them."""
    for file in files:
        fsync_file(directory / file)
    manifest = {
        "format": format_version,
        "rows": rows,
        "files": files,
        "bytes": {file: (directory / file).stat().st_size for file in files},
        "sha256": {file: file_sha256(directory / file) for file in files},
    }
    with open(directory / MANIFEST, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(manifest, indent=2) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    fsync_file(directory)


def read_manifest(directory: Path, *, format_version: int) -> dict[str, Any]:
    """The manifest of the entry ``directory``, checked for shape and against its files' sizes and
    checksums (entries written before those were recorded are checked by loading them)."""
    path = directory / MANIFEST
    manifest = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(manifest, dict):
        raise CacheError(f"{path} holds {type(manifest).__name__}, not a JSON object")
    files, rows = manifest.get("files"), manifest.get("rows")
    if manifest.get("format") != format_version:
        raise CacheError(f"{path} says format {manifest.get('format')!r}, this code reads {format_version}")
    if type(rows) is not int or rows < 0:
        raise CacheError(f"{path} has no row count (rows: {rows!r})")
    if not isinstance(files, list) or not all(_plain_name(file) for file in files):
        raise CacheError(f"{path} has no list of file names (files: {files!r})")
    for key, kind in (("bytes", int), ("sha256", str)):
        recorded = manifest.get(key, {})
        if not isinstance(recorded, dict) or set(recorded) - set(files):
            raise CacheError(f"{path}: {key} must map the listed files to values, got {recorded!r}")
        if not all(type(value) is kind for value in recorded.values()):
            raise CacheError(f"{path}: every {key} value must be a {kind.__name__}, got {recorded!r}")
    _check_files(directory, manifest)
    return manifest


def _plain_name(file: Any) -> bool:
    """A file name inside the entry's directory (no path, no parent)."""
    return isinstance(file, str) and file not in ("", ".", "..") and Path(file).name == file


def _check_files(directory: Path, manifest: dict[str, Any]) -> None:
    """Each file's size and SHA-256 against the manifest."""
    for file, size in manifest.get("bytes", {}).items():
        actual = (directory / file).stat().st_size
        if actual != size:
            raise CacheError(f"{directory / file} has {actual} bytes, its manifest says {size}")
    for file, digest in manifest.get("sha256", {}).items():
        if file_sha256(directory / file) != digest:
            raise CacheError(f"{directory / file} does not match the checksum in its manifest")
