"""Lightning callbacks this project adds to every Trainer."""

from __future__ import annotations

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
