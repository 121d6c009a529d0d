"""Lightning callbacks this project adds to every Trainer."""

from __future__ import annotations

import time

import pytorch_lightning as pl


class BatchSamplerEpoch(pl.Callback):
    """Tells the training batch sampler which epoch starts, so every epoch draws a new batch order.

    Lightning calls ``set_epoch`` on ``dataloader.sampler`` and ``dataloader.batch_sampler.sampler``
    but not on a custom ``batch_sampler`` itself, so without this callback the token-bucket sampler
    would repeat epoch 0's order for the whole run.
    """

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        batch_sampler = getattr(trainer.train_dataloader, "batch_sampler", None)
        if callable(getattr(batch_sampler, "set_epoch", None)):
            batch_sampler.set_epoch(trainer.current_epoch)


class ElapsedTime(pl.Callback):
    """Logs ``time/elapsed_min`` (wall-clock minutes of fitting so far) with every validation.

    Learning curves against time, not steps, are what equal-budget comparisons need. The count
    survives a resume: minutes spent before the checkpoint are stored in it and added back.
    """

    def __init__(self) -> None:
        self._minutes_before = 0.0
        self._started: float | None = None

    def elapsed_minutes(self) -> float:
        running = 0.0 if self._started is None else (time.monotonic() - self._started) / 60
        return self._minutes_before + running

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._started = time.monotonic()

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            pl_module.log("time/elapsed_min", self.elapsed_minutes(), rank_zero_only=True)

    def state_dict(self) -> dict[str, float]:
        return {"elapsed_min": self.elapsed_minutes()}

    def load_state_dict(self, state_dict: dict[str, float]) -> None:
        self._minutes_before = state_dict["elapsed_min"]
