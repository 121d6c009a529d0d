"""Tests for app.training.callbacks with a real Lightning Trainer."""

from __future__ import annotations

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from app.data.batching import TokenBucketBatchSampler
from app.training.callbacks import BatchSamplerEpoch, ElapsedTime


class RecordBatches(pl.LightningModule):
    """Fits nothing; remembers which example indices each epoch's batches held, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: dict[int, list[list[int]]] = {}

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.seen.setdefault(self.current_epoch, []).append(batch[0].tolist())
        return (self.weight**2).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit_epochs(callbacks: list[pl.Callback], epochs: int = 3) -> tuple[dict, TokenBucketBatchSampler]:
    lengths = [(7 * i) % 23 + 1 for i in range(200)]
    sampler = TokenBucketBatchSampler(lengths=lengths, max_tokens=60, seed=5)
    loader = DataLoader(TensorDataset(torch.arange(len(lengths))), batch_sampler=sampler)
    module = RecordBatches()
    trainer = pl.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        callbacks=callbacks,
    )
    trainer.fit(module, loader)
    return module.seen, sampler


def test_every_epoch_draws_the_samplers_order_for_that_epoch() -> None:
    seen, sampler = fit_epochs([BatchSamplerEpoch()])
    for epoch in range(3):
        assert seen[epoch] == [batch.tolist() for batch in sampler._epoch_batches(epoch)]
    assert seen[0] != seen[1] != seen[2]


def test_without_the_callback_lightning_repeats_the_first_order() -> None:
    """Documents why the callback exists: if Lightning starts doing it itself, this test says so."""
    seen, _ = fit_epochs([])
    assert seen[0] == seen[1] == seen[2]


class Validated(RecordBatches):
    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self.log("val/x", float(batch_idx))


def test_elapsed_minutes_logged_with_validation_and_carried_over_a_resume() -> None:
    loader = DataLoader(TensorDataset(torch.arange(8)), batch_size=4)
    clock = ElapsedTime()
    clock.load_state_dict({"elapsed_min": 12.5})  # as if restored from a checkpoint
    trainer = pl.Trainer(
        max_epochs=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[clock],
    )
    trainer.fit(Validated(), loader, loader)
    logged = float(trainer.callback_metrics["time/elapsed_min"])
    assert 12.5 < logged < 12.5 + 5
    assert clock.state_dict()["elapsed_min"] >= logged
