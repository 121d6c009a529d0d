"""``datasets.load_dataset`` over a cache that heals.

``datasets`` converts a corpus to Arrow once and maps the cached file on every later load. A cache file that
was cut short (a full disk, a killed process, a copy gone wrong) either fails to map (``OSError`` or
``pyarrow.ArrowInvalid``: the run dies on a file the user never wrote) or, cut at a record-batch boundary,
maps as a *shorter* dataset with no error at all: a training corpus or a test set would lose
lines silently. :func:`load_dataset_healed` checks each loaded split's rows against the count ``datasets``
recorded when it built the cache and rebuilds a cache that fails either way, once, with a warning.
"""

from __future__ import annotations

import logging
from typing import Any

import datasets
import pyarrow as pa

log = logging.getLogger(__name__)

__all__ = ["load_dataset_healed", "short_splits"]


def short_splits(dataset: datasets.Dataset | datasets.DatasetDict) -> list[str]:
    """Splits of a loaded dataset with fewer or more rows than its cache's ``dataset_info`` recorded
    (e.g. ``["train: 0 of 20000 rows"]``); none for a dataset whose info records no counts."""
    splits = dataset.values() if isinstance(dataset, datasets.DatasetDict) else [dataset]
    wrong = []
    for split in splits:  # a slice ("train[:100]") has no recorded count of its own
        recorded = (split.info.splits or {}).get(str(split.split))
        if recorded is not None and recorded.num_examples and recorded.num_examples != split.num_rows:
            wrong.append(f"{recorded.name}: {split.num_rows} of {recorded.num_examples} rows")
    return wrong


def load_dataset_healed(*args: Any, **kwargs: Any) -> Any:
    """``datasets.load_dataset(*args, **kwargs)``; a cache that fails to load or holds the wrong number of
    rows is rebuilt from the source (``download_mode="force_redownload"``). A missing source or no network
    is not a cache fault: those errors are raised as they are."""
    try:
        dataset = datasets.load_dataset(*args, **kwargs)
    except (FileNotFoundError, ConnectionError):
        raise
    except (OSError, pa.ArrowException) as error:
        fault = f"{type(error).__name__}: {error}"
    else:
        wrong = short_splits(dataset) if isinstance(dataset, datasets.Dataset | datasets.DatasetDict) else []
        if not wrong:
            return dataset
        fault = "rows missing from the cache: " + ", ".join(wrong)
    source = kwargs.get("data_files") or (args[0] if args else kwargs.get("path"))
    log.warning("the datasets cache of %s did not load (%s): rebuilding it", source, fault)
    return datasets.load_dataset(*args, **{**kwargs, "download_mode": "force_redownload"})
