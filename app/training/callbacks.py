"""Lightning callbacks this project adds to every Trainer."""

from __future__ import annotations

import hashlib
import json
import logging
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Timer

from app.data.batch import Batch
from app.data.corpus import TextDigest
from app.data.encoded import text_column
from app.training.distributed import gather_objects
from app.training.optim import NO_TIME_BUDGET, Schedule

log = logging.getLogger(__name__)


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


def steps_within_budget(step: int, steps_per_s: float, remaining_s: float) -> int:
    """The optimizer step a run at ``step`` reaches when its remaining time runs out at its current rate."""
    return step + int(steps_per_s * max(remaining_s, 0.0))


class DecayToTimeBudget(pl.Callback):
    """``optim.decay_steps=auto``: a cosine or linear schedule reaches zero when ``trainer.max_time`` ends.

    How many steps an hour holds depends on the machine, so instead of a step count fitted to one CPU the
    decay's end is estimated while training: every ``every_n_steps`` optimizer steps it becomes the step
    the run will reach at the rate measured so far in this process (validation included, since it takes
    its share of the rest of the budget too). Early estimates can be some percent off (the first epochs'
    validation decodes slower); the error shrinks with the time left, so the schedule still ends near
    zero with the budget and the last updates are the small ones. Rank 0's estimate is broadcast, so
    every rank follows one schedule. The value is logged as ``optim/decay_steps`` and checkpointed with
    the scheduler (:class:`~app.training.optim.Schedule`). With ``trainer.max_steps`` set too, the decay
    ends at whichever comes first. ``schedule`` is the object the module's LambdaLR follows
    (:func:`app.training.optim.configured_schedule` builds it once for both).
    """

    def __init__(self, schedule: Schedule, every_n_steps: int = 20) -> None:
        self.schedule = schedule
        self.every_n_steps = every_n_steps
        self._started: tuple[int, float] | None = None  # (step, monotonic time) when this process began
        self._last_update = -1

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        time_budget(trainer)  # fails now, not at the first estimate, when there is no budget
        self._started = (trainer.global_step, time.monotonic())

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step % self.every_n_steps == 0 and step != self._last_update:
            self._last_update = step
            self.update(trainer, pl_module)

    def update(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Re-estimate the decay's last step and hand it to the scheduler."""
        assert self._started is not None, "on_train_start has not run"
        start_step, start_time = self._started
        step, seconds = trainer.global_step, time.monotonic() - start_time
        if step <= start_step or seconds <= 0:
            return
        remaining = time_budget(trainer).time_remaining() or 0.0
        estimate = steps_within_budget(step, (step - start_step) / seconds, remaining)
        if trainer.max_steps > 0:
            estimate = min(estimate, trainer.max_steps)
        estimate = trainer.strategy.broadcast(estimate)  # one schedule for every rank
        self.schedule.decay_steps = max(estimate, self.schedule.warmup + 1)
        pl_module.log("optim/decay_steps", float(estimate), on_step=True, on_epoch=False, rank_zero_only=True)


def time_budget(trainer: pl.Trainer) -> Timer:
    """Lightning's ``max_time`` timer; a clear error where the run has no wall-clock budget."""
    timers = [c for c in trainer.callbacks if isinstance(c, Timer)]
    if not timers:
        raise ValueError(NO_TIME_BUDGET)
    return timers[0]


class SamplerPosition(pl.Callback):
    """Tells the training batch sampler how many batches of the epoch have been trained on.

    Checkpoints store that count (through :class:`app.data.datamodule.ResumableDataLoader`) so a resumed
    run skips exactly those batches. It runs before any checkpoint callback (Lightning orders checkpoint
    callbacks last), so a checkpoint written after a batch counts that batch.
    """

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        batch_sampler = getattr(trainer.train_dataloader, "batch_sampler", None)
        if callable(getattr(batch_sampler, "mark_consumed", None)):
            batch_sampler.mark_consumed(batch_idx + 1)


class RngState(pl.Callback):
    """Seeds each rank's random generators apart and keeps each rank's state across a resume.

    Every rank other than 0 starts from ``seed + global rank`` (torch, numpy, python), so the ranks of a
    distributed run draw different dropout masks; rank 0 keeps the stream a single-process run has. The
    data order is unaffected (the batch sampler has its own seed).
    Lightning restores model, optimizer, scheduler and loop counters but not the generators, so the
    states of all ranks are gathered into each checkpoint (a list in rank order) and every rank restores
    its own: a resumed run draws the masks an uninterrupted one would. A checkpoint from another world
    size, or one holding a single state (older checkpoints), restores what it has, with a warning.
    """

    KEY = "rng_states"

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and trainer.global_rank > 0:
            rank_seed = self.seed + trainer.global_rank
            torch.manual_seed(rank_seed)  # CUDA generators too
            np.random.seed(rank_seed)
            random.seed(rank_seed)

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        checkpoint[self.KEY] = gather_objects(rng_states())  # every rank dumps checkpoints; rank 0 writes

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        states = checkpoint.get(self.KEY)
        if states is None:
            return
        if isinstance(states, dict):  # one state for all ranks
            states = [states]
        if len(states) != trainer.world_size:
            log.warning(
                "checkpoint holds random states of %d rank(s), this run has %d: the resumed dropout "
                "masks differ from an uninterrupted run's",
                len(states),
                trainer.world_size,
            )
        set_rng_states(states[trainer.global_rank % len(states)])


def rng_states() -> dict[str, Any]:
    """This process's generator states: torch, CUDA (every device), numpy, python.

    Only tensors, numbers and tuples, so a checkpoint holding them opens with ``weights_only=True``
    (numpy's state is an array, stored here as a tensor: see :func:`numpy_state`).
    """
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": numpy_state(),
        "python": random.getstate(),
    }


def numpy_state() -> dict[str, Any]:
    """``np.random.get_state()`` without numpy objects: the MT19937 key as an int64 tensor."""
    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    return {
        "kind": str(kind),
        "keys": torch.from_numpy(keys.astype(np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached_gaussian),
    }


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore what :func:`rng_states` returned (or the numpy tuple older checkpoints hold)."""
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    state = states["numpy"]
    if isinstance(state, dict):
        keys = np.asarray(state["keys"].numpy(), dtype=np.uint32)
        state = (state["kind"], keys, state["pos"], state["has_gauss"], state["cached_gaussian"])
    np.random.set_state(state)
    random.setstate(states["python"])


def weights_digest(module: torch.nn.Module) -> str:
    """SHA-1 of every parameter's bytes: equal digests mean bitwise-equal weights (e.g. across ranks)."""
    digest = hashlib.sha1()
    for name, param in module.named_parameters():
        digest.update(name.encode())
        digest.update(param.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def tokens_digest(batch: Batch) -> str:
    """SHA-1 of a batch's source and target id tensors (shapes included, through the padding)."""
    digest = hashlib.sha1()
    for ids in (batch.src, batch.tgt_out):
        digest.update(str(tuple(ids.shape)).encode())
        digest.update(ids.cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


class DataFingerprint(pl.Callback):
    """Refuses to resume on other data: every checkpoint holds the SHA-256 of the training and validation
    texts (both sides) and of both sentencepiece models, and a resume whose own differ fails, naming what
    changed. A changed corpus or tokenizer with the same vocabulary size would otherwise resume silently,
    with ids that now mean other subwords and a sampler position in another batch order. Checkpoints
    written before this callback hold no fingerprint and resume unchecked.
    """

    def __init__(self) -> None:
        self.fingerprint: dict[str, str] = {}

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            translator = pl_module.translator
            corpora = trainer.datamodule.corpora.texts()
            self.fingerprint = data_fingerprint(corpora, translator.src_tokenizer, translator.tgt_tokenizer)

    def state_dict(self) -> dict[str, str]:
        return dict(self.fingerprint)

    def load_state_dict(self, state_dict: dict[str, str]) -> None:
        if not self.fingerprint:  # not fitting (trainer.validate/test from a checkpoint): nothing to resume
            return
        changed = fingerprint_changes(state_dict, self.fingerprint)
        if changed:
            raise ValueError(
                f"cannot resume: the checkpoint was trained on other data ({'; '.join(changed)}). Resuming "
                f"would continue with ids that mean other subwords; restore the original files, or start a "
                f"new run in another directory (hydra.run.dir=...)"
            )


def data_fingerprint(corpora: dict[str, Any], src_tokenizer: Any, tgt_tokenizer: Any) -> dict[str, str]:
    """SHA-256 of the train and valid texts (``<split>.src``/``.tgt``) and of the two tokenizer models."""
    found = {}
    for split in ("train", "valid"):
        if split in corpora:
            for side in ("src", "tgt"):
                digest = TextDigest()
                text_column(corpora[split], side).update_digest(digest)
                found[f"{split}.{side}"] = digest.hexdigest()
    found["src_tokenizer"] = hashlib.sha256(src_tokenizer.to_bytes()).hexdigest()
    found["tgt_tokenizer"] = hashlib.sha256(tgt_tokenizer.to_bytes()).hexdigest()
    return found


_FINGERPRINT_NAMES = {
    "train.src": "the training source texts",
    "train.tgt": "the training target texts",
    "valid.src": "the validation source texts",
    "valid.tgt": "the validation target texts",
    "src_tokenizer": "the source sentencepiece model",
    "tgt_tokenizer": "the target sentencepiece model",
}


def fingerprint_changes(saved: dict[str, str], current: dict[str, str]) -> list[str]:
    """What differs between a checkpoint's fingerprint and this run's, in words (empty: nothing)."""
    return [
        f"{_FINGERPRINT_NAMES.get(name, name)} changed (sha256 {value[:12]} in the checkpoint, "
        f"{current[name][:12] if name in current else 'none'} now)"
        for name, value in sorted(saved.items())
        if current.get(name) != value
    ]


class BatchTrace(pl.Callback):
    """Debugging aid (``debug.trace_batches=PATH``): one JSON line per training batch.

    Each line holds the optimizer step, epoch, batch index, learning rate, loss, the example ids of the
    batch, a digest of its padded token ids (what the model read: they change between epochs under
    subword sampling), a digest of the torch generator's state (the dropout stream) and a digest of the
    weights after the step (a pass over all weights: debugging only), so two runs (an
    interrupted-and-resumed one and an uninterrupted one, say) can be compared batch by batch.
    Every rank writes its own file: ``PATH`` on rank 0, ``PATH.rank<r>`` elsewhere.
    Lines are flushed at once so that a killed run leaves every finished batch in the file.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._handle: Any = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        path = self.path if trainer.global_rank == 0 else Path(f"{self.path}.rank{trainer.global_rank}")
        path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = path.open("a", encoding="utf-8")

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if isinstance(outputs, dict):  # {} or None for a skipped batch
            outputs = outputs.get("token_loss", outputs.get("loss"))
        loss = outputs
        record = {
            "step": trainer.global_step,
            "epoch": trainer.current_epoch,
            "batch_idx": batch_idx,
            "lr": trainer.optimizers[0].param_groups[0]["lr"],
            "loss": None if loss is None else float(loss),
            "ids": batch.index.tolist(),
            "tokens": tokens_digest(batch),
            "weights": weights_digest(pl_module),
            "rng": hashlib.sha1(torch.get_rng_state().numpy().tobytes()).hexdigest(),  # dropout stream
        }
        self._handle.write(json.dumps(record) + "\n")
        self._handle.flush()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


class SameRunDirectory(pl.Callback):
    """Fails fast when the ranks of a distributed run would write to different run directories.

    Lightning's own launcher hands its run directory to the processes it starts; ranks started by
    torchrun or srun each resolve Hydra's timestamped default themselves and may disagree by a second.
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = str(Path(run_dir).resolve())

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        dirs = gather_objects(self.run_dir)
        if len(set(dirs)) > 1:
            raise ValueError(
                f"the ranks resolved different run directories {dirs}: launch with an explicit "
                f"hydra.run.dir=... (e.g. hydra.run.dir=runs/$SLURM_JOB_ID) so every rank writes to one place"
            )
