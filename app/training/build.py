"""The steps that turn a resolved run config into what ``trainer.fit`` needs, one job each.

:func:`app.training.task.build_fit` calls them in order: the run directory and seeds, the warm start
(if any), the corpora (:class:`app.data.corpora.Corpora`), their tokenizers, the model, and the
LightningModule. Each step takes the pieces it needs and returns one, so a test or a benchmark can
run one step alone and a reader sees what depends on what.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch

from app.checkpoint import LoadedModel
from app.data.batch import BatchLayoutError, check_layout
from app.data.corpora import Corpora
from app.data.encoded import text_column
from app.data.multilingual_corpus import language_samples
from app.data.subword_training import train_or_load, train_or_load_joint
from app.data.tokenizer import SubwordConfig, Tokenizer, settings_from_config
from app.inference.engine import SearchSettings
from app.models import build_model, packing_families
from app.models.seq2seq import Seq2Seq
from app.ranks import launched_as_rank_zero
from app.training.module import TranslationModule
from app.training.optim import Schedule
from app.training.warm_start import load_start, load_weights

log = logging.getLogger(__name__)

Tokenizers = tuple[Tokenizer, Tokenizer]  # (source, target); one object twice for a joint model


def prepare_process(output_dir: str, seed: int, num_threads: int | None) -> None:
    """Create the run directory (rank 0), seed every generator, and set torch's thread count."""
    if launched_as_rank_zero():
        Path(output_dir).mkdir(parents=True, exist_ok=True)
    pl.seed_everything(seed, workers=True)
    if num_threads:
        torch.set_num_threads(num_threads)


def check_batch_layout(config: Mapping[str, Any]) -> None:
    """Refuse, before any data is prepared, a ``data.layout`` the run cannot train on: an unknown one, or
    ``packed`` for a model family without a packed forward pass (the RNNs) or under ``compile_model=true``
    (which compiles the padded ``forward`` only)."""
    data = config["data"]
    layout = data.get("layout") or "padded"
    check_layout(layout, data.get("pad_to_multiple") or 1)
    if layout != "packed":
        return
    family = config["model"].get("family")
    families = packing_families()
    if family not in families:
        raise BatchLayoutError(
            f"data.layout=packed: model.family={family} does not train on packed batches (only "
            f"{', '.join(families)} do); use data.layout=padded"
        )
    if config.get("compile_model"):
        raise BatchLayoutError(
            "data.layout=packed with compile_model=true: only the padded forward pass is compiled; "
            "use data.layout=padded to compile, or compile_model=false"
        )


def warm_start(config: Mapping[str, Any]) -> LoadedModel | None:
    """The checkpoint ``init_from`` names, checked against this run's config; None without one.
    Loaded before the data, so that a start that does not fit fails before anything is prepared."""
    source = config.get("init_from")
    return load_start(source, config) if source else None


def subword_tokenizers(corpora: Corpora, data: Mapping[str, Any]) -> Tokenizers:
    """The sentencepiece models for these corpora and ``data.subword``: trained once, then loaded from
    the cache. Every piece the layout needs whole (target tags, the separator) is a user-defined symbol.

    A tagged run trains one joint model on a sample balanced across its languages
    (:func:`app.data.multilingual_corpus.language_samples`); an untagged one trains on the training
    sentences (before ``data.concat`` joins them).
    """
    layout = corpora.layout
    config = settings_from_config(SubwordConfig, layout.subword_settings(data["subword"]), "data.subword")
    cache_dir = Path(data["cache_dir"]) / "spm"
    if layout.tagged:
        parts = language_samples(data, layout.directions, config.input_sentence_size, config.seed)
        joint = train_or_load_joint(parts, config=config, cache_dir=cache_dir, corpus_key="multilingual")
        return joint, joint
    return train_or_load(
        src_texts=text_column(corpora.train_sentences, "src"),
        tgt_texts=text_column(corpora.train_sentences, "tgt"),
        config=config,
        cache_dir=cache_dir,
        corpus_key=layout.directions[0],
    )


def run_tokenizers(corpora: Corpora, data: Mapping[str, Any], start: LoadedModel | None) -> Tokenizers:
    """A warm start's tokenizers (its weights were trained on their pieces), else this corpus's own."""
    if start is not None:
        return start.src_tokenizer, start.tgt_tokenizer
    return subword_tokenizers(corpora, data)


def run_model(config: Mapping[str, Any], tokenizers: Tokenizers, start: LoadedModel | None) -> Seq2Seq:
    """The configured model for these vocabularies, holding the warm start's weights if there is one.

    With ``compile_model=true`` it is compiled in place (parameter names, and so checkpoints, stay the same).
    """
    src_tok, tgt_tok = tokenizers
    model = build_model(
        config["model"],
        config["attention"],
        src_vocab_size=src_tok.vocab_size,
        tgt_vocab_size=tgt_tok.vocab_size,
        pad_id=tgt_tok.pad_id,
    )
    if start is not None:
        load_weights(model, start, config, source=config["init_from"])
    log.info("model: %s parameters", f"{model.num_parameters():,}")
    if config.get("compile_model"):
        model.compile(dynamic=True)
    return model


def run_module(
    config: Mapping[str, Any], model: Seq2Seq, tokenizers: Tokenizers, corpora: Corpora, schedule: Schedule
) -> TranslationModule:
    """The LightningModule: the ``optim`` settings, the schedule built once, the validation split."""
    optim = {key: value for key, value in config["optim"].items() if key not in SCHEDULE_KEYS}
    if config.get("compile_model"):
        optim["fused_loss"] = False  # compile covers forward(); the fused loss would bypass it
    return TranslationModule(
        model=model,
        src_tokenizer=tokenizers[0],
        tgt_tokenizer=tokenizers[1],
        config=dict(config),
        schedule=schedule,
        valid_search=SearchSettings(**config["valid_search"]),
        validation=corpora["valid"],
        nonfinite_loss=config.get("nonfinite_loss", "stop"),
        **optim,
    )


SCHEDULE_KEYS = ("schedule", "warmup_steps", "decay_steps")  # optim keys the Schedule object carries
