"""What a training step reads from the device, and when: only at the steps whose metrics are written.

On a GPU every ``.item()``, ``bool()`` or ``.tolist()`` of a device tensor waits until all queued work is
done, so the GPU idles while Python prepares the next step. The module therefore reads its losses (the
non-finite check, the progress bar's loss) at the steps Lightning writes anyway, and the progress bar
shows host numbers.
"""

from __future__ import annotations

import math
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import RichProgressBar


class HostValuesBar(RichProgressBar):
    """Lightning's rich progress bar plus the module's ``progress_values`` (plain floats).

    Lightning converts every progress-bar tensor logged in an epoch with ``.item()`` after each batch, so
    the module logs no tensor with ``prog_bar=True`` and hands its loss and tokens per second here as
    numbers, read at the steps :func:`writes_step_metrics` names.
    """

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        return {**super().get_metrics(trainer, pl_module), **getattr(pl_module, "progress_values", {})}


def writes_step_metrics(trainer: pl.Trainer) -> bool:
    """Whether Lightning writes this batch's step metrics to the loggers (every ``log_every_n_steps``
    optimizer steps, and at the last), the rule of its ``update_train_step_metrics``."""
    accumulating = trainer.fit_loop._should_accumulate()
    return bool(trainer._logger_connector.should_update_logs) and not accumulating


def first_nonfinite(pending: list[tuple[torch.Tensor, str]]) -> tuple[str, float] | None:
    """The first of ``pending`` ((2,) loss and NLL sums, where they were) holding a NaN or infinity, with
    its loss; None when all are finite. One read of the device for all of them."""
    if not pending:
        return None
    values = torch.stack([sums for sums, _ in pending]).tolist()  # (steps, 2)
    for (loss, nll), (_, where) in zip(values, pending, strict=True):
        if not (math.isfinite(loss) and math.isfinite(nll)):
            return where, loss
    return None
