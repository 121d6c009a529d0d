"""Turn the ``data`` config into the train / valid / test parallel texts (memory-mapped datasets).

A corpus comes either from local line-aligned files (``files``; missing files are prepared first by
the fetcher named in ``fetch``, e.g. Multi30k) or from a ``datasets`` hub dataset (``hub``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import datasets

from app.data.corpus import CorpusError, open_hub_parallel, open_parallel
from app.data.multi30k import prepare_multi30k

SPLIT_NAMES = ("train", "valid", "test")


def _fetch_multi30k(cfg: Mapping[str, Any]) -> None:
    prepare_multi30k(cfg["dir"], source=cfg.get("source"), langs=sorted({cfg["src_lang"], cfg["tgt_lang"]}))


# Fetchers prepare missing local files; ``data.fetch`` names one (or null to never fetch).
FETCHERS: dict[str, Callable[[Mapping[str, Any]], None]] = {"multi30k": _fetch_multi30k}


def load_corpora(cfg: Mapping[str, Any]) -> dict[str, datasets.Dataset]:
    """Every split named in the config as a ``src`` / ``tgt`` dataset, keyed by 'train', 'valid', 'test'.

    The texts stay in memory-mapped Arrow files; nothing here reads a corpus into Python objects.
    """
    cache_dir = cfg.get("cache_dir")
    if cfg.get("hub"):
        return {split: _load_hub_split(cfg["hub"], split, cache_dir) for split in SPLIT_NAMES}
    files = cfg["files"]
    ensure_files(cfg)
    return {
        split: open_parallel(files[split]["src"], files[split]["tgt"], cache_dir=cache_dir)
        for split in SPLIT_NAMES
    }


def ensure_files(cfg: Mapping[str, Any]) -> None:
    """Run the configured fetcher when any corpus file is missing; then every file must exist."""
    paths = [Path(cfg["files"][split][side]) for split in SPLIT_NAMES for side in ("src", "tgt")]
    if all(p.exists() for p in paths):
        return
    fetch = cfg.get("fetch")
    if fetch:
        if fetch not in FETCHERS:
            raise CorpusError(
                f"unknown data.fetch {fetch!r}; valid choices: {', '.join(sorted(FETCHERS))} or null"
            )
        FETCHERS[fetch](cfg)
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise CorpusError(f"corpus file(s) not found: {', '.join(missing)}")


def _load_hub_split(hub: Mapping[str, Any], split: str, cache_dir: str | None) -> datasets.Dataset:
    return open_hub_parallel(
        hub["name"],
        config=hub.get("config"),
        split=hub["splits"][split],
        src_column=hub["src_column"],
        tgt_column=hub["tgt_column"],
        data_files=hub.get("data_files"),
        cache_dir=cache_dir,
    )
