"""Tests for app.callbacks with a real Lightning Trainer."""

from __future__ import annotations

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from app.callbacks import BatchSamplerEpoch
from app.data.batching import TokenBucketBatchSampler


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
        assert seen[epoch] == sampler._epoch_batches(epoch)
    assert seen[0] != seen[1] != seen[2]


def test_without_the_callback_lightning_repeats_the_first_order() -> None:
    """Documents why the callback exists: if Lightning starts doing it itself, this test says so."""
    seen, _ = fit_epochs([])
    assert seen[0] == seen[1] == seen[2]
