"""The LightningModule: training with label smoothing, validation loss and BLEU, checkpoint contents.

It receives a built model and knows nothing about configs beyond what it stores in checkpoints.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

import pytorch_lightning as pl
import torch

from app.checkpoint import CHECKPOINT_KEY
from app.data.batch import Batch
from app.data.tokenizer import Tokenizer
from app.losses import label_smoothed_nll
from app.metrics import corpus_scores
from app.models.seq2seq import Seq2Seq
from app.optim import build_optimizer
from app.translator import SearchSettings, Translator


class TranslationModule(pl.LightningModule):
    def __init__(
        self,
        *,
        model: Seq2Seq,
        src_tokenizer: Tokenizer,
        tgt_tokenizer: Tokenizer,
        config: dict[str, Any],
        label_smoothing: float = 0.1,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.98),
        eps: float = 1e-9,
        warmup_steps: int = 4000,
        valid_search: SearchSettings | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.translator = Translator(model, src_tokenizer, tgt_tokenizer)
        self.config = config  # the resolved run config, stored in every checkpoint
        self.label_smoothing = label_smoothing
        self.optim_args = {
            "lr": lr,
            "weight_decay": weight_decay,
            "betas": tuple(betas),
            "eps": eps,
            "warmup": warmup_steps,
        }
        self.valid_search = valid_search or SearchSettings(beam=1)
        self.pad_id = tgt_tokenizer.pad_id
        self._valid_hyps: dict[int, list[int]] = {}
        self._tokens_seen, self._clock = 0, time.perf_counter()
        self.tokens_trained = 0  # real source + target tokens of every training batch so far

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        return self.model(src, tgt_in)

    def _losses(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, int]:
        logits = self.model(batch.src, batch.tgt_in)
        loss, nll = label_smoothed_nll(
            logits, batch.tgt_out, epsilon=self.label_smoothing, pad_id=self.pad_id
        )
        return loss, nll, batch.num_target_tokens

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        loss, nll, ntok = self._losses(batch)
        self._tokens_seen += batch.num_tokens
        self.tokens_trained += batch.num_tokens
        self.log("train/loss", loss / ntok, prog_bar=True, batch_size=ntok)
        self.log("train/nll", nll / ntok, batch_size=ntok)
        return loss / ntok

    def on_train_batch_end(self, outputs: Any, batch: Batch, batch_idx: int) -> None:
        if (batch_idx + 1) % max(self.trainer.log_every_n_steps, 1) == 0:
            now = time.perf_counter()
            self.log("train/tokens_per_s", self._tokens_seen / max(now - self._clock, 1e-9), prog_bar=True)
            self._tokens_seen, self._clock = 0, now

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        loss, nll, ntok = self._losses(batch)
        self.log("val/loss", loss / ntok, batch_size=ntok, sync_dist=True)
        self.log("val/nll", nll / ntok, batch_size=ntok, sync_dist=True)
        sources = [row[row != self.pad_id].tolist() for row in batch.src]
        hyps = self.translator.translate_ids(sources, self.valid_search)
        self._valid_hyps.update(zip(batch.index.tolist(), hyps, strict=True))

    def on_validation_epoch_end(self) -> None:
        references = self.trainer.datamodule.valid_references
        if len(self._valid_hyps) != len(references):  # sanity check runs or limit_val_batches: no BLEU
            self._valid_hyps.clear()
            return
        order = sorted(self._valid_hyps)
        hyps = self.translator.tgt_tokenizer.decode([self._valid_hyps[i] for i in order])
        scores = corpus_scores(hyps, references)
        self._valid_hyps.clear()
        self.log("val/bleu", scores.bleu, prog_bar=True)
        self.log("val/bleu_lc", scores.bleu_lc)
        self.log("val/chrf", scores.chrf)

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer, scheduler = build_optimizer(self.model, **self.optim_args)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[CHECKPOINT_KEY] = {
            "config": self.config,
            "src_spm": self.translator.src_tokenizer.to_bytes(),
            "tgt_spm": self.translator.tgt_tokenizer.to_bytes(),
            "valid_search": asdict(self.valid_search),
        }
