"""Open the files (or hub dataset) behind each direction of a run as ``src`` / ``tgt`` datasets.

A corpus comes either from local line-aligned files (missing files are prepared first by the fetcher
named in ``data.fetch``, e.g. Multi30k) or from a ``datasets`` hub dataset (``data.hub``). Which files
belong to which direction is :func:`app.data.corpora.corpus_files`' to say; this module only opens them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets

from app.data.corpus import CorpusError, open_hub_parallel, open_parallel
from app.data.multi30k import prepare_multi30k

SPLIT_NAMES = ("train", "valid", "test")
Files = Mapping[str, Mapping[str, Mapping[str, str]]]  # {direction: {split: {"src": path, "tgt": path}}}


def _fetch_multi30k(cfg: Mapping[str, Any], langs: Sequence[str]) -> None:
    prepare_multi30k(cfg["dir"], source=cfg.get("source"), langs=list(langs))


# Fetchers prepare missing local files for the languages asked; ``data.fetch`` names one (or null).
FETCHERS: dict[str, Callable[[Mapping[str, Any], Sequence[str]], None]] = {"multi30k": _fetch_multi30k}


def open_files(
    cfg: Mapping[str, Any], files: Files, langs: Sequence[str]
) -> dict[str, dict[str, datasets.Dataset]]:
    """Every direction's splits as memory-mapped ``src`` / ``tgt`` datasets, ``{direction: {split: ...}}``.

    Missing files are fetched first (``data.fetch``, for ``langs``); nothing reads a corpus into Python.
    """
    ensure_files(
        cfg,
        sorted({path for splits in files.values() for sides in splits.values() for path in sides.values()}),
        langs,
    )
    cache_dir = cfg.get("cache_dir")
    return {
        direction: {
            split: open_parallel(splits[split]["src"], splits[split]["tgt"], cache_dir=cache_dir)
            for split in SPLIT_NAMES
        }
        for direction, splits in files.items()
    }


def open_hub(cfg: Mapping[str, Any]) -> dict[str, datasets.Dataset]:
    """The splits of the ``data.hub`` dataset, ``{split: src/tgt dataset}``."""
    hub, cache_dir = cfg["hub"], cfg.get("cache_dir")
    return {
        split: open_hub_parallel(
            hub["name"],
            config=hub.get("config"),
            split=hub["splits"][split],
            src_column=hub["src_column"],
            tgt_column=hub["tgt_column"],
            data_files=hub.get("data_files"),
            cache_dir=cache_dir,
        )
        for split in SPLIT_NAMES
    }


def ensure_files(cfg: Mapping[str, Any], files: Sequence[str], langs: Sequence[str]) -> None:
    """Run the configured fetcher when any of ``files`` is missing; then every file must exist."""
    paths = [Path(path) for path in files]
    if all(p.exists() for p in paths):
        return
    fetch = cfg.get("fetch")
    if fetch:
        if fetch not in FETCHERS:
            raise CorpusError(
                f"unknown data.fetch {fetch!r}; valid choices: {', '.join(sorted(FETCHERS))} or null"
            )
        FETCHERS[fetch](cfg, langs)
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise CorpusError(f"corpus file(s) not found: {', '.join(missing)}")
