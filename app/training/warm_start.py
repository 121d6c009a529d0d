"""``init_from=CKPT``: start a new run from another run's weights and tokenizers (fine-tuning).

``resume`` continues a run: its optimizer, schedule, step count and data position come back. A warm
start begins a *new* run from a trained model: only the weights and the sentencepiece models are taken
from the checkpoint, while the optimizer, the learning-rate schedule, the step counter and the data
are this run's own. The typical use is a multilingual model fine-tuned on one of its directions:

    python train.py experiment=multi30k_tiny_cosine_en_de_lc data.directions=[en-de] \\
        init_from=runs/ml6/checkpoints/best.ckpt

The checkpoint is opened weights-only (:func:`app.checkpoint.read_checkpoint`), so nothing in it runs.
The model this run's config builds must take the weights (same sizes; dropout may differ). Its attention
may differ: another head layout (``heads=gqa|mqa``: keys and values mean-pooled per group) or kernel
(``attention=linear|linformer|sparse|lsh|...``) converts the trained layers first
(:mod:`app.attention.convert`, uptraining as Ainslie et al. 2023); anything else is refused with the
config keys that differ. The run's ``data.subword`` settings are not used: the text is cut into the
checkpoint's pieces, which the weights were trained on.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from app.attention.convert import convert_state
from app.checkpoint import CheckpointError, LoadedModel, load_model
from app.data.corpora import CorpusLayout
from app.data.multilingual import TAG_FORMAT, Languages, language_tag
from app.data.tokenizer import Tokenizer
from app.models.seq2seq import Seq2Seq

log = logging.getLogger(__name__)


def load_start(path: str, config: Mapping[str, Any]) -> LoadedModel:
    """The model and tokenizers of checkpoint ``path``, checked to suit the run ``config`` describes."""
    check_exists(path, config)
    start = load_model(path)
    layout = CorpusLayout.from_config(config.get("data") or {})
    check_languages(layout, start, source=path)
    check_separator(layout, start, source=path)
    log.info(
        "init_from=%s: starting from its weights and tokenizers (%s parameters); data.subword is not used",
        path,
        f"{start.model.num_parameters():,}",
    )
    return start


def check_exists(path: str, config: Mapping[str, Any]) -> None:
    """Refuse a start checkpoint that is not there, saying where it was looked for and, for a fine-tune
    arm of the length sweep (``from_sweep``: conf/experiment/ablation_length_finetune.yaml), which job
    of which sweep should have written it."""
    if Path(path).is_file():
        return
    sweep = config.get("from_sweep")
    if sweep:
        raise CheckpointError(
            f"init_from={path}: no such checkpoint. It is the best checkpoint of the job with this run's "
            f"attention and seed at data.concat=1 in from_sweep={sweep}; that job has not finished there "
            f"(run it: make ablation-length SWEEP={sweep}), or from_sweep names the wrong sweep"
        )
    raise CheckpointError(f"init_from={path}: no such checkpoint")


def check_separator(layout: CorpusLayout, start: LoadedModel, *, source: str) -> None:
    """Refuse to fine-tune on joined examples (``data.concat`` > 1) with tokenizers that cannot write
    their separator as one piece: the separator would become unknown pieces, and the translations could
    not be split back into sentences. A single-sentence model has it when trained with
    ``data.subword.user_defined_symbols=[<sep>]`` (conf/experiment/ablation_length.yaml does)."""
    sep, tokenizers = layout.separator, (start.src_tokenizer, start.tgt_tokenizer)
    if sep is not None and not all(is_one_piece(tokenizer, sep) for tokenizer in tokenizers):
        raise CheckpointError(
            f"init_from={source}: its tokenizers have no {sep} piece, which data.concat={layout.concat} "
            f"joins sentences with; train the start model with data.subword.user_defined_symbols=[{sep}]"
        )


def check_languages(layout: CorpusLayout, start: LoadedModel, *, source: str) -> None:
    """Refuse a warm start whose sources would carry tags the start model never saw, or would lack the
    tags it was trained to read."""
    ours = Languages(layout.scored_directions, layout.tagged, layout.tag_format)
    theirs = Languages.from_config(start.config)
    if theirs.tagged and not ours.tagged:
        raise CheckpointError(
            f"init_from={source} was trained with target-language tags ({theirs.describe()}); give "
            f"data.directions (e.g. data.directions=[{theirs.directions[0]}]{spelling(theirs)}) so that "
            "this run's sources carry them too"
        )
    if not ours.tagged:
        return
    tags = {lang: language_tag(lang, ours.tag_format) for lang in ours.targets}
    missing = [lang for lang, tag in tags.items() if not is_one_piece(start.src_tokenizer, tag)]
    if missing:
        raise CheckpointError(
            f"init_from={source}: its vocabulary has no tag for target language(s) {missing} that "
            f"data.directions asks for, written {ours.tag_format}; the model was trained on "
            f"{theirs.describe()}{spelling(theirs)}"
        )


def spelling(languages: Languages) -> str:
    """`` data.tag_format='...'`` for a tagged model whose tags are not written ours (an OPUS-MT model's)."""
    return f" data.tag_format='{languages.tag_format}'" if languages.tag_format != TAG_FORMAT else ""


def is_one_piece(tokenizer: Tokenizer, symbol: str) -> bool:
    """Whether ``symbol`` is a piece of ``tokenizer``'s vocabulary (a user-defined symbol), not split; with
    the word boundary in front (``▁>>fra<<``, an imported OPUS-MT model's language tokens) it is too."""
    pieces = [piece for piece in tokenizer.id_to_piece(tokenizer.encode([symbol])[0]) if piece != "▁"]
    return pieces in ([symbol], [f"▁{symbol}"])


def load_weights(model: Seq2Seq, start: LoadedModel, config: Mapping[str, Any], *, source: str) -> None:
    """Copy ``start``'s weights into ``model`` (built from this run's config), its attention converted where
    this run names another head layout or kernel (:func:`app.attention.convert.convert_state`, one log line
    per tensor kind), or say which model and attention settings differ when the weights still do not fit."""
    try:
        conversion = convert_state(start.model, model)
    except ValueError as err:
        raise CheckpointError(f"init_from={source}: {err}") from err
    try:
        model.load_state_dict(conversion.state)
    except RuntimeError as err:
        differing = config_differences(config, start.config, ("model", "attention"))
        raise CheckpointError(
            f"init_from={source}: its weights do not fit the model this run builds; settings that differ "
            f"(here vs there): {differing or 'none in model/attention'} ({str(err).splitlines()[0]})"
        ) from err
    for note in conversion.notes():
        log.info("init_from=%s: attention converted: %s", source, note)


def config_differences(ours: Mapping[str, Any], theirs: Mapping[str, Any], groups: tuple[str, ...]) -> str:
    """``group.key=here vs there`` for every key of ``groups`` whose value differs, comma-separated."""
    found = []
    for group in groups:
        a, b = ours.get(group) or {}, theirs.get(group) or {}
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                found.append(f"{group}.{key}={a.get(key)!r} vs {b.get(key)!r}")
    return ", ".join(found)
