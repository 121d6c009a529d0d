"""Counting host reads of tensor values (``.item()``, ``bool()``, ``int()``, ``float()``, ``.tolist()``) per
training batch of a real Lightning run.

On a GPU each such read waits until every kernel queued so far has finished, so the GPU idles while
Python prepares the next step; on the CPU the same calls are cheap, but counting them here shows where a
GPU run would stall. This instruments torch's own tensor methods for the duration of a fit; nothing of
the project is replaced. On the CPU every tensor is a host tensor, so reads made while a DataLoader
collates a batch (host tensors on a GPU too, before the batch is moved) are left out; every other read
is counted as a read of the device.
"""

from __future__ import annotations

import traceback
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytorch_lightning as pl
import torch

READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")
LOADING = "/torch/utils/data/"  # reads under a DataLoader's fetch are of host tensors (the collator's)
# Frames a read's site skips, to name the code that asked for it rather than the conversion helpers
PLUMBING = ("/torch/", "/lightning_fabric/", "/lightning_utilities/", "/logger_connector/")


@dataclass
class BatchReads:
    """The reads of one training batch (from its ``on_train_batch_start`` until the next batch or
    validation), and whether Lightning writes its step metrics to the loggers."""

    batch_idx: int
    writes_logs: bool
    sites: list[str] = field(default_factory=list)  # "file:line function (read)" of each read


class DeviceReads(pl.Callback):
    """A callback that, while :meth:`counting` is active, attributes every tensor read to its batch."""

    def __init__(self) -> None:
        self.batches: list[BatchReads] = []
        self._current: BatchReads | None = None

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        writes = trainer._logger_connector.should_update_logs and not trainer.fit_loop._should_accumulate()
        self._current = BatchReads(batch_idx, writes)
        self.batches.append(self._current)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self._current = None  # validation reads its losses and decodes: not a training step's cost

    def on_train_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self._current = None

    def silent_batches(self) -> list[BatchReads]:
        """The batches whose step metrics Lightning does not write."""
        return [b for b in self.batches if not b.writes_logs]

    def sites(self, batches: list[BatchReads]) -> Counter[str]:
        return Counter(site for b in batches for site in b.sites)

    def _record(self, read: str) -> None:
        if self._current is None:
            return
        stack = traceback.extract_stack()[:-2]
        if any(LOADING in f.filename for f in stack):
            return  # the collator's host tensors, before the batch moves to the device: no wait
        frames = [f for f in stack if not any(part in f.filename for part in PLUMBING)]
        where = "?"
        if frames:
            caller = frames[-1]
            where = f"{caller.filename.rsplit('site-packages/', 1)[-1]}:{caller.lineno} {caller.name}"
        self._current.sites.append(f"{where} ({read})")

    @contextmanager
    def counting(self) -> Iterator[DeviceReads]:
        """Wrap torch.Tensor's reading methods with counters for the duration of the block."""
        originals = {name: getattr(torch.Tensor, name) for name in READS}

        def wrap(name: str, original: Any) -> Any:
            def read(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                self._record(name)
                return original(tensor, *args, **kwargs)

            return read

        for name, original in originals.items():
            setattr(torch.Tensor, name, wrap(name, original))
        try:
            yield self
        finally:
            for name, original in originals.items():
                setattr(torch.Tensor, name, original)
