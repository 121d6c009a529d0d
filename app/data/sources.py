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
from app.data.multilingual import configured_directions, parse_direction
from app.data.multilingual_corpus import all_files, load_directions

SPLIT_NAMES = ("train", "valid", "test")


def _fetch_multi30k(cfg: Mapping[str, Any]) -> None:
    directions = configured_directions(cfg) or [f"{cfg['src_lang']}-{cfg['tgt_lang']}"]
    langs = sorted({lang for direction in directions for lang in parse_direction(direction)})
    prepare_multi30k(cfg["dir"], source=cfg.get("source"), langs=langs)


# Fetchers prepare missing local files; ``data.fetch`` names one (or null to never fetch).
FETCHERS: dict[str, Callable[[Mapping[str, Any]], None]] = {"multi30k": _fetch_multi30k}


def load_corpora(cfg: Mapping[str, Any]) -> dict[str, datasets.Dataset]:
    """Every split named in the config as a ``src`` / ``tgt`` dataset, keyed by 'train', 'valid', 'test'.

    The texts stay in memory-mapped Arrow files; nothing here reads a corpus into Python objects.
    With ``data.directions`` each split is every direction's pairs, tagged and concatenated
    (:mod:`app.data.multilingual_corpus`).
    """
    cache_dir = cfg.get("cache_dir")
    directions = configured_directions(cfg)
    if directions is not None:
        ensure_files(cfg, all_files(cfg, directions))
        return load_directions(cfg, directions)
    if cfg.get("hub"):
        return {split: _load_hub_split(cfg["hub"], split, cache_dir) for split in SPLIT_NAMES}
    files = cfg["files"]
    ensure_files(cfg)
    return {
        split: open_parallel(files[split]["src"], files[split]["tgt"], cache_dir=cache_dir)
        for split in SPLIT_NAMES
    }


def ensure_files(cfg: Mapping[str, Any], files: list[str] | None = None) -> None:
    """Run the configured fetcher when any corpus file (``files``, else those of ``data.files``) is
    missing; then every file must exist."""
    if files is None:
        files = [cfg["files"][split][side] for split in SPLIT_NAMES for side in ("src", "tgt")]
    paths = [Path(path) for path in files]
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
