"""``train(cfg)``: corpus -> tokenizers -> model -> Lightning fit -> test scores in results.json."""

from __future__ import annotations

import inspect
import json
import logging
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import pytorch_lightning as pl
import torch
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint, RichProgressBar

from app.data.concat import concat_corpora, subword_symbols
from app.data.datamodule import TranslationDataModule
from app.data.encoded import text_column
from app.data.multilingual import configured_directions, tag_symbols
from app.data.multilingual_corpus import language_samples
from app.data.sources import load_corpora
from app.data.subword_training import train_or_load, train_or_load_joint
from app.data.tokenizer import SubwordConfig, SubwordSampling, Tokenizer, settings_from_config
from app.hardware import machine_description, resolve_precision
from app.inference.engine import SearchSettings
from app.inference.run_scoring import score_run
from app.inference.selection import check_selection, validation_monitor
from app.models import build_model
from app.ranks import launched_as_rank_zero
from app.rundir import BEST, STEP_STEM, RunDir
from app.training.callbacks import (
    NO_TIME_BUDGET,
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
from app.training.optim import AUTO, schedule_factor
from app.training.warm_start import load_start, load_weights

log = logging.getLogger(__name__)


@dataclass
class Fit:
    """Everything ``trainer.fit`` needs, built from a config (see :func:`build_fit`)."""

    corpora: dict[str, datasets.Dataset]
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
    check_schedule(cfg)
    finished = finished_results(cfg)
    if finished is not None:
        return finished
    return fit_and_evaluate(build_fit(cfg), cfg)


def check_mandatory_keys(cfg: DictConfig) -> None:
    """Fail before anything runs, naming by path every mandatory value (``???``) the config leaves unset."""
    missing = sorted(unset_keys(cfg))
    if cfg.get("data") and (cfg.data.get("directions") or cfg.data.get("pairs")):  # files come per direction
        missing = [key for key in missing if not key.startswith("data.files")]
    if missing:
        raise ValueError(
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
    """Corpus, tokenizers, model, LightningModule, DataModule and Trainer for ``cfg``, ready to fit."""
    run_dir = Path(cfg.output_dir)
    if launched_as_rank_zero():
        run_dir.mkdir(parents=True, exist_ok=True)
    pl.seed_everything(cfg.seed, workers=True)
    if cfg.get("num_threads"):
        torch.set_num_threads(cfg.num_threads)
    config = OmegaConf.to_container(cfg, resolve=True)

    start = load_start(cfg.init_from, config) if cfg.get("init_from") else None  # before the data: fail fast
    corpora = load_corpora(config["data"])
    if start is not None:  # a warm start cuts the text into the pieces its weights were trained on
        src_tok, tgt_tok = start.src_tokenizer, start.tgt_tokenizer
    else:
        src_tok, tgt_tok = subword_tokenizers(config["data"], corpora["train"])  # on sentences, not examples
    corpora = concat_corpora(corpora, config["data"].get("concat", 1))
    model = build_model(
        config["model"],
        config["attention"],
        src_vocab_size=src_tok.vocab_size,
        tgt_vocab_size=tgt_tok.vocab_size,
        pad_id=tgt_tok.pad_id,
    )
    if start is not None:
        load_weights(model, start, config, source=cfg.init_from)
    log.info("model: %s parameters", f"{model.num_parameters():,}")
    optim = dict(config["optim"])
    if cfg.get("compile"):
        model.compile(dynamic=True)  # in place: parameter names (and checkpoints) stay the same
        optim["fused_loss"] = False  # compile covers forward(); the fused loss would bypass it
    datamodule = TranslationDataModule(
        corpora=corpora,
        src_tokenizer=src_tok,
        tgt_tokenizer=tgt_tok,
        max_tokens=cfg.data.max_tokens,
        max_len=cfg.data.max_len,
        max_positions=model.max_positions,
        cache_dir=Path(cfg.data.cache_dir) / "tokens",
        eval_max_tokens=cfg.data.get("eval_max_tokens"),
        max_ratio=cfg.data.get("max_ratio"),
        seed=cfg.seed,
        num_proc=cfg.data.get("num_proc", 1),
        num_workers=cfg.data.get("num_workers", 0),
        subword_sampling=SubwordSampling.from_config(
            config["data"].get("subword_sampling"), config["data"]["subword"].get("model_type", "unigram")
        ),
        sampling_temperature=cfg.data.get("sampling_temperature") or 1.0,
    )
    module = TranslationModule(
        model=model,
        src_tokenizer=src_tok,
        tgt_tokenizer=tgt_tok,
        config=config,
        valid_search=SearchSettings(**config["valid_search"]),
        nonfinite_loss=cfg.get("nonfinite_loss", "stop"),
        **optim,
    )
    return Fit(corpora, module, datamodule, build_trainer(cfg, run_dir), RunDir(run_dir))


def fit_and_evaluate(fit: Fit, cfg: DictConfig) -> dict[str, Any]:
    """Fit (resuming when asked), then on rank 0 choose on validation and score the test set."""
    trainer, module = fit.trainer, fit.module
    started = time.perf_counter()
    trainer.fit(module, datamodule=fit.datamodule, ckpt_path=resume_path(cfg, fit.run))
    fit_seconds = time.perf_counter() - started
    if not trainer.is_global_zero:
        return {}
    results = score_run(
        fit.run,
        OmegaConf.to_container(cfg, resolve=True),  # type: ignore[arg-type]
        fit.corpora,
        final_checkpoint(trainer),
        device=trainer.strategy.root_device,  # a GPU run decodes (and times its decoding) on its GPU
        kept=run_statistics(trainer, module, fit_seconds),
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


def subword_tokenizers(data_cfg: dict[str, Any], train: datasets.Dataset) -> tuple[Tokenizer, Tokenizer]:
    """The sentencepiece models for this corpus and settings: trained once, then loaded from the cache.

    A multilingual run trains one joint model on a sample balanced across its languages, with every
    target-language tag as a user-defined symbol (:mod:`app.data.multilingual`).
    """
    directions = configured_directions(data_cfg)
    if directions is not None:
        config = settings_from_config(
            SubwordConfig, tag_symbols(data_cfg["subword"], directions), "data.subword"
        )
        parts = language_samples(data_cfg, directions, config.input_sentence_size, config.seed)
        joint = train_or_load_joint(
            parts, config=config, cache_dir=Path(data_cfg["cache_dir"]) / "spm", corpus_key="multilingual"
        )
        return joint, joint
    return train_or_load(
        src_texts=text_column(train, "src"),
        tgt_texts=text_column(train, "tgt"),
        config=settings_from_config(
            SubwordConfig, subword_symbols(data_cfg["subword"], data_cfg.get("concat", 1)), "data.subword"
        ),
        cache_dir=Path(data_cfg["cache_dir"]) / "spm",
        corpus_key=f"{data_cfg['src_lang']}-{data_cfg['tgt_lang']}",
    )


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
        "world_size": trainer.world_size,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        **peak_gpu_memory(trainer.strategy.root_device),
        "machine": machine_description(trainer.strategy.root_device),
    }


def peak_gpu_memory(device: torch.device) -> dict[str, int]:
    """``peak_gpu_mb``: the most GPU memory the run's tensors held (nothing for a CPU run)."""
    if device.type != "cuda":
        return {}
    return {"peak_gpu_mb": round(torch.cuda.max_memory_allocated(device) / 2**20)}


def build_trainer(cfg: DictConfig, run_dir: Path) -> pl.Trainer:
    """A Lightning Trainer from ``cfg.trainer`` plus this project's callbacks, logger and checkpoint I/O."""
    options = OmegaConf.to_container(cfg.trainer, resolve=True)
    check_trainer_options(options)
    options["precision"] = resolve_precision(
        options.get("precision", "32-true"), str(options.get("accelerator"))
    )
    callbacks = [*checkpoint_callbacks(cfg, run_dir), *training_callbacks(cfg, run_dir)]
    if options.get("enable_progress_bar", True):
        callbacks.append(RichProgressBar())
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


def training_callbacks(cfg: DictConfig, run_dir: Path) -> list[pl.Callback]:
    """Learning-rate and elapsed-time logging, batch order and resume state, early stopping, batch tracing."""
    callbacks: list[pl.Callback] = [
        BatchSamplerEpoch(),
        SamplerPosition(),
        RngState(cfg.seed),
        DataFingerprint(),
        SameRunDirectory(run_dir),
        ElapsedTime(),
    ]
    if cfg.optim.get("decay_steps") == AUTO:
        callbacks.append(DecayToTimeBudget())
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


def check_schedule(cfg: DictConfig) -> None:
    """Refuse, before any data is prepared, a learning-rate schedule that could not run to its end."""
    decay_steps = cfg.optim.get("decay_steps")
    schedule_factor(cfg.optim.schedule, cfg.optim.warmup_steps, decay_steps)
    if decay_steps == AUTO and not cfg.trainer.get("max_time"):
        raise ValueError(NO_TIME_BUDGET)


def check_trainer_options(options: dict[str, Any]) -> None:
    valid = set(inspect.signature(pl.Trainer.__init__).parameters) - {"self"}
    bad = sorted(set(options) - valid)
    if bad:
        raise ValueError(f"unknown trainer option(s) {bad}; valid options: {', '.join(sorted(valid))}")


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
