"""What the training and data benchmarks share: train.py's config bounded to a benchmark run, and a
clock for its training steps (time, tokens, model FLOPs, memory)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from torch import Tensor, nn

from app.bench.memory import anon_rss_mb
from app.bench.timing import CONF_DIR
from app.data.batch import Batch, PackedBatch
from app.models.flops import supports_flop_count, transformer_training_flops
from app.training.distributed import register_resolvers


class StepClock(pl.Callback):
    """Per training step, after the optimizer step: when it ended, its real (all, and target side) and
    padded token counts, its model FLOPs (a model whose FLOPs can be counted, e.g. not an RNN), and
    optionally the largest anonymous RSS seen at a step's end; also when the first batch arrived (the
    run's start-up time).

    ``flops=False`` skips the FLOP count (the data benchmark needs none); ``anon_rss=True`` reads
    ``/proc/self/status`` at every step's end (the data benchmark's memory figure).
    """

    def __init__(self, *, flops: bool = True, anon_rss: bool = False) -> None:
        self.count_flops, self.track_anon_rss = flops, anon_rss
        self.first_batch: float | None = None
        self.ends: list[float] = []
        self.tokens: list[int] = []
        self.target_tokens: list[int] = []  # the target side's real tokens (what fairseq and NVIDIA report)
        self.padded: list[int] = []
        # (passes, source lengths (B,), target lengths (B,)) per step, as the batch holds them (on its
        # device): counted into FLOPs when read (:attr:`flops`), so that no timed step waits for the device
        self.step_lengths: list[tuple[int, Tensor, Tensor]] = []
        self.model: nn.Module | None = None
        self.peak_anon_mb: int | None = None

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Batch | PackedBatch, batch_idx: int
    ) -> None:
        if self.first_batch is None:
            self.first_batch = time.perf_counter()

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Batch | PackedBatch,
        batch_idx: int,
    ) -> None:
        self.ends.append(time.perf_counter())
        self.tokens.append(batch.num_tokens)
        self.target_tokens.append(batch.num_target_tokens)
        self.padded.append(batch.slots)
        model = pl_module.model
        if self.count_flops and supports_flop_count(model):
            self.model = model
            passes = pl_module.passes_per_batch  # R-Drop runs the model twice over each batch
            self.step_lengths.append((passes, *batch.sequence_lengths()))
        anon = anon_rss_mb() if self.track_anon_rss else None
        if anon is not None:
            self.peak_anon_mb = max(anon, self.peak_anon_mb or 0)

    @property
    def flops(self) -> list[int]:
        """Each timed step's training FLOPs (empty where the model's cannot be counted)."""
        return [
            passes * transformer_training_flops(self.model, src, tgt)
            for passes, src, tgt in self.step_lengths
        ]

    def tokens_per_s(self, warmup: int) -> float:
        """Real tokens per second of the steps after the first ``warmup`` ones."""
        if len(self.ends) <= warmup + 1:
            raise RuntimeError(f"only {len(self.ends)} steps ran; need more than {warmup + 1}")
        return sum(self.tokens[warmup + 1 :]) / (self.ends[-1] - self.ends[warmup])


def bench_config(overrides: list[str], steps: int, out_dir: Path) -> DictConfig:
    """train.py's config with the overrides, bounded to ``steps`` steps with no validation and no files:
    what a benchmark trains (the time limit, checkpoints, early stopping and loggers are switched off)."""
    register_resolvers()
    fixed = [
        f"trainer.max_steps={steps}",
        "trainer.max_time=null",
        "trainer.limit_val_batches=0",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        "checkpoint.every_n_steps=null",
        "early_stopping.patience=0",
        "logger.kind=null",
        f"output_dir={out_dir}",
    ]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=[*overrides, *fixed])
