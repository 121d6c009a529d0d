"""The LightningModule: training with label smoothing, validation loss and BLEU, checkpoint contents.

It receives a built model and knows nothing about configs beyond what it stores in checkpoints.
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import asdict
from typing import Any

import pytorch_lightning as pl
import torch

from app.checkpoint import CHECKPOINT_KEY, translation_payload
from app.data.batch import Batch, PackedBatch
from app.data.corpora import Split
from app.data.tokenizer import Tokenizer
from app.errors import ConfigError
from app.inference.directions import direction_scores, mean_scores
from app.inference.engine import SearchSettings
from app.inference.torch_engine import TorchEngine
from app.models.seq2seq import Seq2Seq
from app.training.distributed import gather_objects
from app.training.losses import label_smoothed_nll, linear_smoothed_nll, symmetric_kl
from app.training.optim import Schedule, build_optimizer
from app.training.step_reads import first_nonfinite, writes_step_metrics

log = logging.getLogger(__name__)

# Validation metrics are computed from values reduced over all ranks, so every rank logs the same number;
# Lightning cannot know that and recommends sync_dist=True for each of them in distributed runs.
warnings.filterwarnings("ignore", message=r"It is recommended to use `self\.log\('val/")


NONFINITE_POLICIES = ("stop", "skip")
UNCHECKED_LIMIT = 200  # nonfinite_loss=stop checks at least every this many batches


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite (and ``nonfinite_loss=stop``)."""


class TranslationModule(pl.LightningModule):
    """Label-smoothed training, validation loss and BLEU; every metric is exact across ranks.

    The training loss of an optimizer step is the token-weighted mean over the batches of all ranks
    and, with ``accumulate_grad_batches``, of all its micro-batches (a plain mean of per-batch means
    would weight short batches too much). Each rank scales its summed loss by ``world_size / R``, R the
    target tokens of all ranks in the step's first micro-batch, so DDP's gradient averaging and
    Lightning's division by ``accumulate_grad_batches`` (N) leave sum-of-losses gradients / (N R); before
    the step they are multiplied by ``N R / (target tokens of all the step's micro-batches)``, a no-op
    without accumulation. R keeps gradients near their usual size while the total is not yet known.
    Validation sums loss and tokens over ranks and gathers the hypotheses of every rank for BLEU, so
    the logged values equal a single-process run's on the same data. ``validation`` is the split those
    batches come from: its references and direction spans score the hypotheses. ``schedule`` is the
    learning-rate multiplier (:func:`app.training.optim.configured_schedule`), built and checked once.
    """

    def __init__(
        self,
        *,
        model: Seq2Seq,
        src_tokenizer: Tokenizer,
        tgt_tokenizer: Tokenizer,
        config: dict[str, Any],
        label_smoothing: float = 0.1,
        rdrop_alpha: float = 0.0,
        fused_loss: bool = True,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.98),
        eps: float = 1e-9,
        schedule: Schedule | None = None,
        fused: bool = False,
        valid_search: SearchSettings | None = None,
        validation: Split | None = None,
        nonfinite_loss: str = "stop",
    ) -> None:
        super().__init__()
        self.model = model
        self.translator = TorchEngine(model, src_tokenizer, tgt_tokenizer)
        self.config = config  # the resolved run config, stored in every checkpoint
        self.label_smoothing = label_smoothing
        if rdrop_alpha < 0:
            raise ConfigError(f"optim.rdrop_alpha={rdrop_alpha}; it must be >= 0 (0: off)")
        self.rdrop_alpha = rdrop_alpha
        self.fused_loss = fused_loss
        self.optim_args = {
            "lr": lr,
            "weight_decay": weight_decay,
            "betas": tuple(betas),
            "eps": eps,
            "fused": fused,
        }
        self.schedule = schedule or Schedule("inverse_sqrt", warmup=4000)
        if nonfinite_loss not in NONFINITE_POLICIES:
            choices = ", ".join(NONFINITE_POLICIES)
            raise ConfigError(f"nonfinite_loss={nonfinite_loss!r}; valid choices: {choices}")
        self.nonfinite_loss = nonfinite_loss
        self.valid_search = valid_search or SearchSettings(beam=1)
        self.validation = validation
        self.pad_id = tgt_tokenizer.pad_id
        self._valid_hyps: dict[int, list[int]] = {}
        self._valid_sums = torch.zeros(3, dtype=torch.float64)  # this rank's loss, nll, target tokens
        self._tokens_seen, self._clock = 0, time.perf_counter()
        self._validation_began = self._clock
        # Target tokens (all ranks) of the micro-batches since the last optimizer step, and of its first.
        self._step_tokens, self._step_reference = 0.0, 0.0
        self.tokens_trained = 0  # real source + target tokens of every training batch so far, all ranks
        self.skipped_batches = 0  # batches skipped for a non-finite loss (nonfinite_loss=skip)
        # nonfinite_loss=stop: the (2,) loss sums of the steps since the last check, and where each was
        # (read in one go at a step whose metrics are written: no per-step wait for the device)
        self._unchecked: list[tuple[torch.Tensor, str]] = []
        self._last_loss: torch.Tensor | None = None  # this step's mean loss, read only at logging steps
        self.progress_values: dict[str, float] = {}  # host numbers the progress bar shows (HostValuesBar)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        return self.model(src, tgt_in)

    def _losses(self, batch: Batch | PackedBatch) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Summed smoothed loss and NLL of one pass; the output layer fused with the loss where it can be."""
        if isinstance(batch, PackedBatch):
            return (*self._packed_losses(batch), batch.num_target_tokens)
        split = self.model.output_features(batch.src, batch.tgt_in) if self.fused_loss else None
        if split is None:
            logits = self.model(batch.src, batch.tgt_in)
            loss, nll = label_smoothed_nll(
                logits, batch.tgt_out, epsilon=self.label_smoothing, pad_id=self.pad_id
            )
        else:
            features, output = split
            loss, nll = linear_smoothed_nll(
                features, output, batch.tgt_out, epsilon=self.label_smoothing, pad_id=self.pad_id
            )
        return loss, nll, batch.num_target_tokens

    def _packed_losses(self, batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed smoothed loss and NLL of a packed batch: (Nt, D) states or (Nt, V) logits of real target
        tokens only. Its targets hold no padding, so the loss's padding test keeps every row."""
        args = (batch.src, batch.src_segments, batch.tgt_in, batch.tgt_segments)
        if self.fused_loss:
            features, output = self.model.packed_output_features(*args)
            return linear_smoothed_nll(
                features, output, batch.tgt_out, epsilon=self.label_smoothing, pad_id=self.pad_id
            )
        logits = self.model.forward_packed(*args)  # (Nt, V)
        return label_smoothed_nll(logits, batch.tgt_out, epsilon=self.label_smoothing, pad_id=self.pad_id)

    @property
    def passes_per_batch(self) -> int:
        """How many times a training step runs the model over its batch (2 with R-Drop)."""
        return 2 if self.rdrop_alpha > 0 else 1

    def _rdrop_losses(self, batch: Batch | PackedBatch) -> tuple[torch.Tensor, torch.Tensor, int]:
        """R-Drop (Liang et al. 2021): the batch twice, in one pass, under two dropout masks.

        Per target token the loss is half the paper's: (CE_1 + CE_2) / 2 + rdrop_alpha * (KL(p_1||p_2) +
        KL(p_2||p_1)) / 4, where ``rdrop_alpha`` is the paper's alpha. Halving keeps token counts, logging
        and gradient scaling those of one copy: without dropout both copies agree, the KL is 0 and the
        loss is the plain one. It costs a second forward and backward pass per batch.
        """
        if isinstance(batch, PackedBatch):
            rows = batch.num_target_tokens
            both = batch.twice()
            logits = self.model.forward_packed(both.src, both.src_segments, both.tgt_in, both.tgt_segments)
            target = both.tgt_out  # (2Nt,)
        else:
            rows = batch.src.size(0)
            logits = self.model(batch.src.repeat(2, 1), batch.tgt_in.repeat(2, 1))  # (2B, T, V)
            target = batch.tgt_out.repeat(2, 1)
        loss, nll = label_smoothed_nll(logits, target, epsilon=self.label_smoothing, pad_id=self.pad_id)
        kl = symmetric_kl(logits[:rows], logits[rows:], batch.tgt_out, pad_id=self.pad_id)
        return loss / 2 + self.rdrop_alpha * kl / 4, nll / 2, batch.num_target_tokens

    def _sum_over_ranks(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` summed over all ranks (unchanged in a single process)."""
        if self.trainer.world_size == 1:
            return values
        return self.trainer.strategy.reduce(values.clone(), reduce_op="sum")

    def training_step(self, batch: Batch | PackedBatch, batch_idx: int) -> dict[str, torch.Tensor] | None:
        loss, nll, ntok = self._rdrop_losses(batch) if self.passes_per_batch == 2 else self._losses(batch)
        sums, (targets, tokens) = self._step_sums(loss, nll, (ntok, batch.num_tokens))
        if self.nonfinite_loss == "skip" and not torch.isfinite(sums).all():  # skip decides now: one read
            return self._nonfinite(batch, float(sums[0]))  # the same decision on every rank: sums are global
        if self.nonfinite_loss == "stop":
            self._unchecked.append((sums, self._where(batch)))
        self._tokens_seen += tokens  # source + target tokens of all ranks
        self.tokens_trained += tokens
        mean_loss = sums[0] / targets
        self._last_loss = mean_loss
        # Tensors, not shown in the progress bar: Lightning converts progress-bar tensors with .item() after
        # every batch, but logged ones only when it writes them (every trainer.log_every_n_steps).
        self.log("train/loss", mean_loss, batch_size=ntok)
        self.log("train/nll", sums[1] / targets, batch_size=ntok)
        self._step_reference = self._step_reference or float(targets)
        self._step_tokens += float(targets)
        # DDP averages gradients over ranks: world_size / R gives sum-of-losses gradients / R (see the class).
        return {"loss": loss * (self.trainer.world_size / self._step_reference), "token_loss": mean_loss}

    def _step_sums(
        self, loss: torch.Tensor, nll: torch.Tensor, counts: tuple[int, int]
    ) -> tuple[torch.Tensor, tuple[int, int]]:
        """The (2,) loss and NLL sums, and the (target, source + target) token ``counts``, of all ranks.

        The counts are the collator's host ints: a single process reads them as they are, without waiting
        for the device; several ranks sum them together with the losses, in one reduction.
        """
        sums = torch.stack([loss.detach().float(), nll.detach().float()])
        if self.trainer.world_size == 1:
            return sums, counts
        totals = self._sum_over_ranks(torch.cat([sums, sums.new_tensor(counts, dtype=torch.float32)]))
        targets, tokens = (int(value) for value in totals[2:].tolist())
        return totals[:2], (targets, tokens)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Make the accumulated gradients those of the token-weighted mean over the step's micro-batches."""
        factor = self.trainer.accumulate_grad_batches * self._step_reference / (self._step_tokens or 1.0)
        self._step_tokens, self._step_reference = 0.0, 0.0
        if factor in (0.0, 1.0):  # no accumulation (or every micro-batch skipped): nothing to rescale
            return
        for param in self.parameters():
            if param.grad is not None:
                param.grad.mul_(factor)

    def _where(self, batch: Batch | PackedBatch) -> str:
        """The step, epoch and batch sizes, for a non-finite loss's message."""
        layout = "packed" if isinstance(batch, PackedBatch) else "padded"
        return (
            f"step {self.global_step} (epoch {self.current_epoch}), batch of {batch.sentences} sentences, "
            f"{batch.num_target_tokens} target tokens, {layout} sizes src {tuple(batch.src.shape)} "
            f"tgt {tuple(batch.tgt_out.shape)}"
        )

    def check_losses(self) -> None:
        """``nonfinite_loss=stop``: raise for the first non-finite loss among the steps since the last check.

        One read of the device for all of them, at a step whose metrics are written anyway, before a
        checkpoint or validation, and at the end of training; a bad step's update is applied meanwhile,
        but no checkpoint holds it and training goes no further than the next check.
        """
        found, self._unchecked = first_nonfinite(self._unchecked), []
        if found is not None:
            self._nonfinite(*found)

    def _nonfinite(self, where: Batch | PackedBatch | str, value: float) -> None:
        """Stop with the step and batch size in the message, or skip the batch and count it."""
        if not isinstance(where, str):
            where = self._where(where)
        if self.nonfinite_loss == "stop":
            raise NonFiniteLossError(
                f"non-finite training loss ({value}) at {where}. Lower optim.lr, keep gradient clipping, use "
                f"trainer.precision=bf16-mixed or 32-true rather than 16-mixed, or set nonfinite_loss=skip."
            )
        self.skipped_batches += 1
        log.warning("skipping a batch with a non-finite loss (%s) at %s", value, where)
        self.log("train/skipped_batches", float(self.skipped_batches))
        return None

    def on_train_start(self) -> None:
        self._tokens_seen, self._clock = 0, time.perf_counter()  # set-up and the sanity check left out

    def on_train_end(self) -> None:
        self.check_losses()

    def on_validation_start(self) -> None:
        self.check_losses()  # no validation (or checkpoint after it) of weights a non-finite loss updated
        self._validation_began = time.perf_counter()

    def on_validation_end(self) -> None:
        """``train/tokens_per_s`` measures training steps: a validation's time (its decoding, which at
        long inputs can outlast the steps between two validations) is moved out of the interval."""
        self._clock += time.perf_counter() - self._validation_began

    def on_train_batch_end(self, outputs: Any, batch: Batch, batch_idx: int) -> None:
        """At the steps whose metrics Lightning writes (and only there), read the device: non-finite
        losses, the progress bar's loss; log the tokens per second since the last such step."""
        if not writes_step_metrics(self.trainer):
            if len(self._unchecked) >= UNCHECKED_LIMIT:  # trainer.log_every_n_steps=0 or very large
                self.check_losses()
            return
        self.check_losses()
        now = time.perf_counter()
        tokens_per_s = self._tokens_seen / max(now - self._clock, 1e-9)
        self.log("train/tokens_per_s", tokens_per_s)
        self._tokens_seen, self._clock = 0, now
        self.progress_values["train/tokens_per_s"] = round(tokens_per_s, 1)
        if self._last_loss is not None:
            self.progress_values["train/loss"] = round(float(self._last_loss), 3)

    def validation_step(self, batch: Batch | PackedBatch, batch_idx: int) -> None:
        """The batch's loss (packed or padded, as it comes), then its greedy or beam translations (always
        decoded on the padded path, from the sources' ids)."""
        loss, nll, ntok = self._losses(batch)
        self._valid_sums += torch.tensor([float(loss), float(nll), ntok], dtype=torch.float64)
        hyps = self.translator.translate_ids(batch.source_ids(), self.valid_search)
        self._valid_hyps.update(zip(batch.index.tolist(), hyps, strict=True))

    def on_validation_epoch_end(self) -> None:
        """Token-weighted loss over all ranks' batches; BLEU of every rank's hypotheses, in corpus order.

        BLEU is always logged (checkpointing and early stopping monitor it): with ``limit_val_batches``
        below the whole set it scores the validated sentences against their own references.
        """
        sums = self._sum_over_ranks(self._valid_sums.to(self.device))
        self._valid_sums = torch.zeros_like(self._valid_sums)  # not zero_(): sums may be the same tensor
        if sums[2] > 0:
            self.log("val/loss", float(sums[0] / sums[2]))
            self.log("val/nll", float(sums[1] / sums[2]))
        hyp_ids: dict[int, list[int]] = {}
        for part in gather_objects(self._valid_hyps):
            hyp_ids.update(part)
        self._valid_hyps.clear()
        if not hyp_ids:
            return
        if self.validation is None:
            raise RuntimeError("TranslationModule(validation=...) is needed to score validation BLEU")
        references = self.validation.references
        validated = sorted(hyp_ids)
        if len(validated) < len(references):  # limit_val_batches or a sanity check: the part decoded
            log.info("val/bleu on the %d of %d validation sentences decoded", len(validated), len(references))
        texts = self.translator.tgt_tokenizer.decode([hyp_ids[i] for i in validated])
        hyps = dict(zip(validated, texts, strict=True))
        self._log_scores([hyps.get(i) for i in range(len(references))])

    def _log_scores(self, decoded: list[str | None]) -> None:
        """``val/bleu`` (etc.): the mean over the validation set's directions (one: its own scores), after
        ``val/bleu/de-en`` (etc.) of each direction scored on its own. None rows were not decoded."""
        valid = self.validation
        assert valid is not None
        scores = direction_scores(decoded, valid.references, valid.spans, moses=False)
        for direction, found in scores.items():
            if direction in valid.scored_directions:
                self.log(f"val/bleu/{direction}", found.bleu)
                self.log(f"val/bleu_lc/{direction}", found.bleu_lc)
                self.log(f"val/chrf/{direction}", found.chrf)
        means = mean_scores(scores)
        self.log("val/bleu", means["bleu"], prog_bar=True)
        self.log("val/bleu_lc", means["bleu_lc"])
        self.log("val/chrf", means["chrf"])

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Lightning's clipping, except where Lightning cannot: sharded (FSDP) norms, fused optimizers.

        With FSDP each rank holds a shard of every gradient, so ``torch.nn.utils.clip_grad_norm_``
        would clip each shard by its own norm (Lightning refuses it); the root FSDP module's own
        ``clip_grad_norm_`` reduces the norm over all shards. Lightning's mixed-precision plugin
        (bf16-mixed and 16-mixed) will not clip for a fused optimizer because a fused step can unscale
        fp16 gradients itself. Without a gradient scaler (bf16) there is nothing to unscale; with one
        (16-mixed) the gradients are unscaled explicitly first, which torch supports (the fused step then
        skips its own unscaling). Either way clipping sees true gradients.
        """
        if not gradient_clip_val:
            return
        sharded = sharded_root(self.trainer.strategy)
        fused = any(group.get("fused") for group in optimizer.param_groups)
        if sharded is None and not fused:
            self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)
            return
        if fused:
            scaler = getattr(self.trainer.precision_plugin, "scaler", None)
            if scaler is not None:
                scaler.unscale_(optimizer)
        if gradient_clip_algorithm == "value":  # elementwise: the same on shards as on whole tensors
            torch.nn.utils.clip_grad_value_(self.parameters(), gradient_clip_val)
        elif sharded is not None:
            sharded.clip_grad_norm_(gradient_clip_val)
        else:
            torch.nn.utils.clip_grad_norm_(self.parameters(), gradient_clip_val)

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer, scheduler = build_optimizer(self.model, schedule=self.schedule, **self.optim_args)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.check_losses()  # never a checkpoint of weights a non-finite loss updated
        checkpoint[CHECKPOINT_KEY] = translation_payload(
            self.config,
            self.translator.src_tokenizer,
            self.translator.tgt_tokenizer,
            valid_search=asdict(self.valid_search),
        )


def sharded_root(strategy: Any) -> Any | None:
    """The strategy's wrapped model when it clips sharded gradients itself (FSDP's ``clip_grad_norm_``)."""
    model = getattr(strategy, "model", None)
    return model if callable(getattr(model, "clip_grad_norm_", None)) else None
