"""``train(cfg)``: corpus -> tokenizers -> model -> Lightning fit -> test scores in results.json."""

from __future__ import annotations

import inspect
import json
import logging
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError
from pytorch_lightning.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint

from app.checkpoint import CheckpointError
from app.data.batch import BatchLayoutError
from app.data.corpora import Corpora, CorpusLayout
from app.data.corpus import CorpusError
from app.data.datamodule import TranslationDataModule
from app.data.multi30k import Multi30kError
from app.data.multilingual import LanguageError
from app.data.tokenizer import TokenizerError
from app.errors import ConfigError
from app.hardware import machine_description, resolve_precision
from app.inference.run_scoring import score_run
from app.inference.selection import check_selection, validation_monitor
from app.io import atomic_write
from app.rundir import BEST, STEP_STEM, RunDir
from app.training.build import (
    check_batch_layout,
    prepare_process,
    run_model,
    run_module,
    run_tokenizers,
    warm_start,
)
from app.training.callbacks import (
    BatchSamplerEpoch,
    BatchTrace,
    DataFingerprint,
    DecayToTimeBudget,
    ElapsedTime,
    RngState,
    SameRunDirectory,
    SamplerPosition,
)
from app.training.checkpoint_io import AtomicCheckpointIO
from app.training.loggers import build_logger, log_results_and_close
from app.training.module import TranslationModule
from app.training.optim import AUTO, Schedule, configured_schedule
from app.training.step_reads import HostValuesBar
from app.training.strategies import weights_only_strategy

log = logging.getLogger(__name__)

# What a run refuses for a reason it names (a config value, attention's included, a corpus, tokenizer or
# checkpoint that cannot work, limits that leave a split empty): the command line reports these as one
# line, anything else with its traceback.
USER_ERRORS = (
    BatchLayoutError,
    CheckpointError,
    ConfigError,
    CorpusError,
    LanguageError,
    Multi30kError,
    TokenizerError,
)


@dataclass
class Fit:
    """Everything ``trainer.fit`` needs, built from a config (see :func:`build_fit`)."""

    corpora: Corpora
    module: TranslationModule
    datamodule: TranslationDataModule
    trainer: pl.Trainer
    run: RunDir


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train the configured model; returns (and writes to ``results.json``) its test-set scores.

    Every rank of a distributed run executes this; only global rank 0 evaluates and writes results.
    """
    check_mandatory_keys(cfg)
    check_selection(cfg)
    finished = finished_results(cfg)
    if finished is not None:
        return finished
    return fit_and_evaluate(build_fit(cfg), cfg)


def train_or_exit(cfg: DictConfig) -> dict[str, Any]:
    """:func:`train` for ``train.py``: a run refused for a reason it names (:data:`USER_ERRORS`) ends with
    that reason on one ``error:`` line and exit status 2, not a traceback (Hydra reports exceptions with
    theirs; ``SystemExit`` passes through it)."""
    try:
        return train(cfg)
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except InterpolationResolutionError as err:  # a resolver's refusal (checkpoint_lr: a missing base)
        cause = refusal_within(err)
        if cause is None:
            raise
        print(f"error: {err.full_key}: {cause}", file=sys.stderr)
        raise SystemExit(2) from None


def refusal_within(err: BaseException) -> BaseException | None:
    """The :data:`USER_ERRORS` refusal an exception wraps (OmegaConf chains a resolver's), or None."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, USER_ERRORS):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def check_mandatory_keys(cfg: DictConfig) -> None:
    """Fail before anything runs, naming by path every mandatory value (``???``) the config leaves unset."""
    missing = sorted(unset_keys(cfg))
    if cfg.get("data") and CorpusLayout.from_config(cfg.data).tagged:  # files come per direction
        missing = [key for key in missing if not key.startswith("data.files")]
    if missing:
        raise ConfigError(
            f"mandatory config value(s) not set: {', '.join(missing)}; "
            f"give each on the command line, e.g. {missing[0]}=..."
        )


def unset_keys(node: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose value is ``???``, found without resolving interpolations: a value that only
    interpolates an unset one (``init_from: ${from_sweep}/...``) is not itself what the user must give,
    and :meth:`OmegaConf.missing_keys` would raise on it instead of naming ``from_sweep``."""
    found = []
    keys = range(len(node)) if OmegaConf.is_list(node) else list(node.keys())
    for key in keys:
        if OmegaConf.is_missing(node, key):
            found.append(f"{prefix}{key}")
        elif not OmegaConf.is_interpolation(node, key) and OmegaConf.is_config(node[key]):
            found += unset_keys(node[key], f"{prefix}{key}.")
    return found


def finished_results(cfg: DictConfig) -> dict[str, Any] | None:
    """With ``resume=true skip_finished=true`` (a resumed sweep), a run that already wrote results.json
    is not trained again: its results are returned as they are. Otherwise None."""
    results = RunDir(cfg.output_dir).results
    if cfg.get("resume") is True and cfg.get("skip_finished") and results.is_file():
        log.info("%s exists: this run finished before, skipping it", results)
        return json.loads(results.read_text())
    return None


def build_fit(cfg: DictConfig) -> Fit:
    """Corpora, tokenizers, model, LightningModule, DataModule and Trainer for ``cfg``, ready to fit.

    The schedule and a warm start are checked first, so a config that cannot run fails before any data
    is prepared; each later step is a function of :mod:`app.training.build`. The data is tokenized and
    its length limits checked here, before the Trainer exists, so that limits which leave a split
    (nearly) empty stop the run at once, naming the settings (:mod:`app.data.length_check`).
    """
    config: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    schedule = configured_schedule(config["optim"], config["trainer"].get("max_time"))
    check_batch_layout(config)
    prepare_process(cfg.output_dir, cfg.seed, cfg.get("num_threads"))
    start = warm_start(config)
    corpora = Corpora.load(config["data"])
    tokenizers = run_tokenizers(corpora, config["data"], start)
    model = run_model(config, tokenizers, start)
    datamodule = TranslationDataModule.from_config(
        config["data"],
        corpora=corpora,
        tokenizers=tokenizers,
        max_positions=model.max_positions,
        seed=cfg.seed,
    )
    datamodule.setup("fit")  # Lightning calls it again in fit(), which then does nothing
    module = run_module(config, model, tokenizers, corpora, schedule)
    run_dir = Path(cfg.output_dir)
    return Fit(corpora, module, datamodule, build_trainer(cfg, run_dir, schedule), RunDir(run_dir))


def fit_and_evaluate(fit: Fit, cfg: DictConfig) -> dict[str, Any]:
    """Fit (resuming when asked), then on rank 0 choose on validation and score the test set."""
    trainer, module = fit.trainer, fit.module
    started = time.perf_counter()
    try:
        trainer.fit(module, datamodule=fit.datamodule, ckpt_path=resume_path(cfg, fit.run))
    except SystemExit:
        if trainer.interrupted:  # Lightning stopped on Ctrl-C and exits 1: say it was an interruption
            raise KeyboardInterrupt from None
        raise
    fit_seconds = time.perf_counter() - started
    if not trainer.is_global_zero:
        return {}
    kept = run_statistics(trainer, module, fit_seconds)
    if not cfg.get("evaluate_test", True):  # a tuning trial: judged on validation, the test set unread
        write_run_statistics(fit.run, kept)
        log_results_and_close(trainer.logger, {})
        return kept
    results = score_run(
        fit.run,
        OmegaConf.to_container(cfg, resolve=True),  # type: ignore[arg-type]
        fit.corpora,
        final_checkpoint(trainer),
        device=trainer.strategy.root_device,  # a GPU run decodes (and times its decoding) on its GPU
        kept=kept,
    )
    log_results_and_close(trainer.logger, results)
    log.info("test scores: %s", json.dumps(results))
    return results


def final_checkpoint(trainer: pl.Trainer) -> Path:
    """The checkpoint to evaluate: the best by validation BLEU, else the most recent one written."""
    best = trainer.checkpoint_callback  # the first ModelCheckpoint: validation BLEU (checkpoint_callbacks)
    if isinstance(best, ModelCheckpoint) and best.best_model_path:
        return Path(best.best_model_path)
    last = RunDir(trainer.default_root_dir).last
    if not last.is_file():
        raise RuntimeError(f"no checkpoint at {last}: no validation ran, checkpoint.every_n_steps unset")
    return last


def run_statistics(trainer: pl.Trainer, module: TranslationModule, fit_seconds: float) -> dict[str, Any]:
    """Size, length and cost of the run, for results.json."""
    return {
        "parameters": module.model.num_parameters(),
        "global_step": trainer.global_step,
        "epochs_completed": trainer.current_epoch,
        "fit_seconds": round(fit_seconds, 1),
        # throughput of the whole fit, validation included; the training-step rate is train/tokens_per_s
        "train_tokens_per_s": round(module.tokens_trained / fit_seconds),
        "skipped_batches": module.skipped_batches,
        "val_best": best_validation_score(trainer),
        "world_size": trainer.world_size,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        **peak_gpu_memory(trainer.strategy.root_device),
        "machine": machine_description(trainer.strategy.root_device),
    }


def best_validation_score(trainer: pl.Trainer) -> float | None:
    """The best validation score of the fit (what best.ckpt follows: ``selection.metric`` decoded with
    ``valid_search``); None where no validation ran. A tuning sweep's objective (app/training/tuning.py)."""
    best = trainer.checkpoint_callback
    score = best.best_model_score if isinstance(best, ModelCheckpoint) else None
    return None if score is None else round(float(score), 4)


def write_run_statistics(run: RunDir, statistics: dict[str, Any]) -> None:
    """``results.json`` of a run that decodes no test set (``evaluate_test=false``): its statistics only."""
    with atomic_write(run.results, "w") as out:
        out.write(json.dumps(statistics, indent=2) + "\n")


def peak_gpu_memory(device: torch.device) -> dict[str, int]:
    """``peak_gpu_mb``: the most GPU memory the run's tensors held (nothing for a CPU run)."""
    if device.type != "cuda":
        return {}
    return {"peak_gpu_mb": round(torch.cuda.max_memory_allocated(device) / 2**20)}


def build_trainer(cfg: DictConfig, run_dir: Path, schedule: Schedule | None = None) -> pl.Trainer:
    """A Lightning Trainer from ``cfg.trainer`` plus this project's callbacks, logger and checkpoint I/O
    (``schedule``: the learning-rate schedule a ``decay_steps=auto`` callback moves the end of)."""
    options = OmegaConf.to_container(cfg.trainer, resolve=True)
    check_trainer_options(options)
    options["precision"] = resolve_precision(
        options.get("precision", "32-true"), str(options.get("accelerator"))
    )
    options["strategy"] = weights_only_strategy(options.get("strategy", "auto"))  # FSDP resumes weights-only
    callbacks = [*checkpoint_callbacks(cfg, run_dir), *training_callbacks(cfg, run_dir, schedule)]
    if options.get("enable_progress_bar", True):
        callbacks.append(HostValuesBar())
    return pl.Trainer(
        **options,
        default_root_dir=run_dir,
        logger=build_logger(cfg.logger, run_dir),
        callbacks=callbacks,
        plugins=[AtomicCheckpointIO()],
        use_distributed_sampler=False,  # the token-bucket sampler shards by rank itself
    )


def checkpoint_callbacks(cfg: DictConfig, run_dir: Path) -> list[pl.Callback]:
    """``best.ckpt`` (validation BLEU) and ``last.ckpt``; with ``checkpoint.every_n_steps`` also
    ``last.ckpt`` every N optimizer steps plus the latest ``checkpoint.keep_last`` ``step-N.ckpt`` files
    (for :func:`app.checkpoint.average_checkpoints`). Only rank 0 writes, atomically."""
    directory = RunDir(run_dir).checkpoints
    # No version counter: both callbacks write the one last.ckpt, and best.ckpt is replaced in place.
    best = ModelCheckpoint(
        dirpath=directory,
        filename=Path(BEST).stem,
        monitor=validation_monitor(cfg),
        mode="max",
        save_last=True,
        save_top_k=1,
        enable_version_counter=False,
    )
    every = cfg.checkpoint.get("every_n_steps")
    if not every:
        return [best]
    steps = ModelCheckpoint(
        dirpath=directory,
        filename=STEP_STEM,
        auto_insert_metric_name=False,
        monitor="step",  # the newest checkpoints are the "best": keep_last of them stay on disk
        mode="max",
        save_top_k=cfg.checkpoint.get("keep_last", 0),
        every_n_train_steps=every,
        save_last=True,
        enable_version_counter=False,
    )
    return [best, steps]


def training_callbacks(cfg: DictConfig, run_dir: Path, schedule: Schedule | None = None) -> list[pl.Callback]:
    """Learning-rate and elapsed-time logging, batch order and resume state, early stopping, batch tracing;
    with ``optim.decay_steps=auto``, the callback that ends ``schedule`` with the time budget."""
    callbacks: list[pl.Callback] = [
        BatchSamplerEpoch(),
        SamplerPosition(),
        RngState(cfg.seed),
        DataFingerprint(),
        SameRunDirectory(run_dir),
        ElapsedTime(),
    ]
    if schedule is not None and cfg.optim.get("decay_steps") == AUTO:
        callbacks.append(DecayToTimeBudget(schedule))
    if cfg.logger and cfg.logger.get("kind"):  # Lightning refuses a learning-rate monitor without a logger
        callbacks.append(LearningRateMonitor(logging_interval="step"))
    if cfg.early_stopping.patience:
        callbacks.append(
            EarlyStopping(
                monitor=validation_monitor(cfg),
                mode="max",
                patience=cfg.early_stopping.patience,
                check_on_train_epoch_end=False,
            )
        )
    trace = cfg.get("debug", {}).get("trace_batches")
    if trace:
        callbacks.append(BatchTrace(trace))
    return callbacks


def check_trainer_options(options: dict[str, Any]) -> None:
    valid = set(inspect.signature(pl.Trainer.__init__).parameters) - {"self"}
    bad = sorted(set(options) - valid)
    if bad:
        raise ConfigError(f"unknown trainer option(s) {bad}; valid options: {', '.join(sorted(valid))}")


def resume_path(cfg: DictConfig, run: RunDir) -> str | None:
    """``resume=true`` continues from the run's last checkpoint; a path resumes from that file."""
    resume = cfg.get("resume")
    if not resume:
        return None
    if resume is True:
        last = run.last
        if not last.is_file():
            log.warning("resume=true but %s does not exist: starting from scratch", last)
            return None
        return str(last)
    return str(resume)
