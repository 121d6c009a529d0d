"""``train(cfg)``: corpus -> tokenizers -> model -> Lightning fit -> test scores in results.json."""

from __future__ import annotations

import inspect
import json
import logging
import resource
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint, RichProgressBar

from app.callbacks import BatchSamplerEpoch, ElapsedTime
from app.checkpoint import load_translator
from app.checkpoint_io import AtomicCheckpointIO
from app.data.corpus import ParallelText
from app.data.datamodule import TranslationDataModule
from app.data.sources import load_corpora
from app.data.tokenizer import SubwordConfig, Tokenizer, train_or_load
from app.hardware import resolve_precision
from app.lit_module import TranslationModule
from app.loggers import build_logger, log_results_and_close
from app.metrics import corpus_scores
from app.models import build_model
from app.translator import SearchSettings

log = logging.getLogger(__name__)


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train the configured model; returns (and writes to ``results.json``) its test-set scores."""
    run_dir = Path(cfg.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    pl.seed_everything(cfg.seed, workers=True)
    if cfg.get("num_threads"):
        torch.set_num_threads(cfg.num_threads)
    config = OmegaConf.to_container(cfg, resolve=True)

    corpora = load_corpora(config["data"])
    src_tok, tgt_tok = subword_tokenizers(config["data"], corpora["train"])
    model = build_model(
        config["model"],
        config["attention"],
        src_vocab_size=src_tok.vocab_size,
        tgt_vocab_size=tgt_tok.vocab_size,
        pad_id=tgt_tok.pad_id,
    )
    log.info("model: %s parameters", f"{model.num_parameters():,}")
    datamodule = TranslationDataModule(
        corpora=corpora,
        src_tokenizer=src_tok,
        tgt_tokenizer=tgt_tok,
        max_tokens=cfg.data.max_tokens,
        max_len=cfg.data.max_len,
        max_positions=model.max_positions,
        eval_max_tokens=cfg.data.get("eval_max_tokens"),
        seed=cfg.seed,
    )
    module = TranslationModule(
        model=model,
        src_tokenizer=src_tok,
        tgt_tokenizer=tgt_tok,
        config=config,
        valid_search=SearchSettings(**config["valid_search"]),
        **config["optim"],
    )
    trainer = build_trainer(cfg, run_dir)
    started = time.perf_counter()
    trainer.fit(module, datamodule=datamodule, ckpt_path=resume_path(cfg, run_dir))
    fit_seconds = time.perf_counter() - started
    if not trainer.is_global_zero:
        return {}
    best = trainer.checkpoint_callback.best_model_path or trainer.checkpoint_callback.last_model_path
    results = {
        **evaluate_checkpoint(best, corpora["test"].src, corpora["test"].tgt, cfg),
        **run_statistics(trainer, module, fit_seconds),
    }
    (run_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    log_results_and_close(trainer.logger, results)
    log.info("test scores: %s", json.dumps(results))
    return results


def subword_tokenizers(data_cfg: dict[str, Any], train: ParallelText) -> tuple[Tokenizer, Tokenizer]:
    """The sentencepiece models for this corpus and settings: trained once, then loaded from the cache."""
    return train_or_load(
        src_texts=train.src,
        tgt_texts=train.tgt,
        config=SubwordConfig(**data_cfg["subword"]),
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
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def build_trainer(cfg: DictConfig, run_dir: Path) -> pl.Trainer:
    """A Lightning Trainer from ``cfg.trainer`` plus this project's callbacks, logger and checkpoint I/O."""
    options = OmegaConf.to_container(cfg.trainer, resolve=True)
    check_trainer_options(options)
    options["precision"] = resolve_precision(
        options.get("precision", "32-true"), str(options.get("accelerator"))
    )
    checkpoints = ModelCheckpoint(
        dirpath=run_dir / "checkpoints",
        filename="best",
        monitor="val/bleu",
        mode="max",
        save_last=True,
        save_top_k=1,
    )
    callbacks: list[pl.Callback] = [
        checkpoints,
        LearningRateMonitor(logging_interval="step"),
        BatchSamplerEpoch(),
        ElapsedTime(),
    ]
    if cfg.early_stopping.patience:
        callbacks.append(
            EarlyStopping(
                monitor="val/bleu",
                mode="max",
                patience=cfg.early_stopping.patience,
                check_on_train_epoch_end=False,
            )
        )
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


def check_trainer_options(options: dict[str, Any]) -> None:
    valid = set(inspect.signature(pl.Trainer.__init__).parameters) - {"self"}
    bad = sorted(set(options) - valid)
    if bad:
        raise ValueError(f"unknown trainer option(s) {bad}; valid options: {', '.join(sorted(valid))}")


def resume_path(cfg: DictConfig, run_dir: Path) -> str | None:
    """``resume=true`` continues from the run's last checkpoint; a path resumes from that file."""
    resume = cfg.get("resume")
    if not resume:
        return None
    if resume is True:
        last = run_dir / "checkpoints" / "last.ckpt"
        if not last.is_file():
            log.warning("resume=true but %s does not exist: starting from scratch", last)
            return None
        return str(last)
    return str(resume)


def evaluate_checkpoint(
    path: str, sources: list[str], references: list[str], cfg: DictConfig
) -> dict[str, Any]:
    """Translate ``sources`` with the checkpoint and score against ``references``."""
    translator, _ = load_translator(path)
    settings = SearchSettings(**OmegaConf.to_container(cfg.test_search, resolve=True))
    started = time.perf_counter()
    hyps = translator.translate(sources, settings)
    decode_seconds = time.perf_counter() - started
    scores = corpus_scores(hyps, references)
    return {
        "checkpoint": str(path),
        "test_set": cfg.data.get("test_name", "test"),
        "beam": settings.beam,
        **scores.rounded(prefix="test_"),
        # decoding cost of the whole test set (batched as test_search says, tokenization included)
        "test_decode_seconds": round(decode_seconds, 2),
        "test_decode_sentences_per_s": round(len(sources) / max(decode_seconds, 1e-9), 1),
        "test_decode_threads": torch.get_num_threads(),
    }
