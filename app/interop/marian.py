"""Marian / OPUS-MT models (Hugging Face's ``MarianMTModel`` directories) as checkpoints of this toolkit.

A directory as ``save_pretrained`` writes it (read by :mod:`app.interop.marian_files`) becomes a
checkpoint that ``translate.py``, the server, the CTranslate2 export and ``init_from`` take like any trained
here. Nothing is special-cased downstream: the architecture is this toolkit's Transformer with the options
Marian needs (``conf/model/marian.yaml``: post-norm, swish, sines-then-cosines positions, a bias on the
logits), and each vocabulary is renumbered to our fixed special ids (:func:`vocabulary_order`).

Marian models come in two vocabulary layouts, and both import: one joint vocabulary (``vocab.json``) and one
embedding for source, target and output (most OPUS-MT models), or separate ones
(``share_encoder_decoder_embeddings: false``: ``vocab.json`` and the encoder's embedding for the source,
``target_vocab.json``, the decoder's embedding, the output layer tied to it and ``final_logits_bias`` for
the target, each side with its own size). The second becomes our Transformer with
``share_src_tgt_embeddings: false``, each side's tokenizer and rows in its own vocabulary's order.

Multilingual OPUS-MT models (e.g. ``opus-mt-en-ROMANCE``) read a target-language token such as ``>>fra<<``
at the start of the source: an entry of the source vocabulary that ``source.spm`` lacks. Our source
tokenizer gets each such entry as a user-defined piece at its vocabulary id (:func:`language_tokens`), so
``>>fra<< The house is small.`` gives the ids ``MarianTokenizer`` gives. The checkpoint's config names a
direction per token (``en-fra``) with ``data.tag_format: ">>{lang}<<"`` (:func:`marian_directions`), so
``translate.py --tgt-lang fra``, the server's ``target_lang`` and a tagged fine-tuning (``data.directions``)
write the token as our own multilingual models get their ``<2xx>`` tags.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from app.checkpoint import model_checkpoint
from app.data.multilingual import LanguageError, parse_direction
from app.data.tokenizer import Tokenizer
from app.interop.marian_files import TARGET_VOCAB, MarianImportError, MarianModel, read_marian_dir
from app.interop.spm_vocab import SPECIAL_PIECES, renumbered_model
from app.models import build_model
from app.models.embeddings import sinusoid_table

log = logging.getLogger(__name__)

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
ACTIVATIONS = {"swish": "swish", "silu": "swish", "gelu": "gelu", "relu": "relu"}  # Hugging Face's -> ours
MARIAN_TAGS = ">>{lang}<<"  # data.tag_format of a multilingual OPUS-MT model
NEVER_LOGIT = -1.0e4
"""The logit bias of our padding id, which Marian's vocabulary lacks (see :func:`vocabulary_order`): its
probability underflows to exactly 0 in float32, so every other token's log-probability is Marian's."""


def model_options(config: dict[str, Any]) -> dict[str, Any]:
    """Our ``model`` config keys for a Marian ``config.json`` (what conf/model/marian.yaml leaves open);
    settings our Transformer cannot represent are refused, naming them."""
    get = config.get
    mismatched = [
        f"{a}={get(a)} but {b}={get(b)}"
        for a, b in (
            ("encoder_attention_heads", "decoder_attention_heads"),
            ("encoder_ffn_dim", "decoder_ffn_dim"),
        )
        if get(a) != get(b)
    ]
    shared = bool(get("share_encoder_decoder_embeddings", True))
    if shared and get("decoder_vocab_size") not in (None, get("vocab_size")):
        mismatched.append(
            f"decoder_vocab_size={get('decoder_vocab_size')} but vocab_size={get('vocab_size')} with "
            "share_encoder_decoder_embeddings=true (one shared vocabulary has one size)"
        )
    if get("activation_function", "gelu") not in ACTIVATIONS:
        mismatched.append(
            f"activation_function={get('activation_function')!r} (ours: {', '.join(ACTIVATIONS)})"
        )
    if get("decoder_start_token_id", get("pad_token_id")) != get("pad_token_id"):
        mismatched.append("decoder_start_token_id differs from pad_token_id")
    if get("normalize_before") or get("add_final_layer_norm") or get("normalize_embedding"):
        mismatched.append("pre-norm or embedding layer norms (Marian's OPUS-MT models have neither)")
    if mismatched:
        raise MarianImportError(f"cannot rebuild this Marian model: {'; '.join(mismatched)}")
    options = {
        "d_model": get("d_model"),
        "num_heads": get("encoder_attention_heads"),
        "encoder_layers": get("encoder_layers"),
        "decoder_layers": get("decoder_layers"),
        "d_ff": get("encoder_ffn_dim"),
        "dropout": get("dropout", 0.1),
        "activation_dropout": get("activation_dropout", 0.0),
        "activation": ACTIVATIONS[get("activation_function", "gelu")],
        "scale_embeddings": bool(get("scale_embedding", False)),
        "tie_embeddings": bool(get("tie_word_embeddings", True)),
        "max_positions": get("max_position_embeddings", 512),
    }
    if not shared:  # the key is left out otherwise: a shared model's overrides stay as they were
        options["share_src_tgt_embeddings"] = False
    return options


@dataclass(frozen=True)
class Vocabulary:
    """One side's Marian vocabulary in our id order."""

    file: str  # where it was read: vocab.json or target_vocab.json
    order: list[int | None]  # Marian's id at each of our ids (None: our padding, which Marian lacks)
    pieces: list[str]  # the piece at each of our ids ("" at our four special ids)


def vocabularies(marian: MarianModel) -> tuple[Vocabulary, Vocabulary]:
    """The (source, target) vocabularies in our order: the same object twice when they are shared.

    The decoder starts from ``pad_token_id`` (``decoder_start_token_id`` must equal it), an id of the
    target vocabulary. With separate vocabularies the source side's own ``<pad>`` entry, which no text
    produces, takes our source bos slot; the encoder never reads that id.
    """
    config = marian.config
    pad, eos = config.get("pad_token_id"), config.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0]
    source_size = config.get("vocab_size", len(marian.vocab))
    if marian.tgt_vocab is None:
        shared = vocabulary_order(marian.vocab, "vocab.json", size=source_size, pad=pad, eos=eos)
        return shared, shared
    source_pad = marian.vocab.get("<pad>", pad)
    source = vocabulary_order(marian.vocab, "vocab.json", size=source_size, pad=source_pad, eos=eos)
    target_size = config.get("decoder_vocab_size") or source_size
    target = vocabulary_order(marian.tgt_vocab, TARGET_VOCAB, size=target_size, pad=pad, eos=eos)
    return source, target


def vocabulary_order(vocab: dict[str, int], file: str, *, size: int, pad: Any, eos: Any) -> Vocabulary:
    """One vocabulary (``file``, ``size`` entries) renumbered to our special ids.

    Marian's vocabulary has eos 0, unk 1 and its padding last, and starts decoding from the padding; ours
    has pad 0, unk 1, bos 2, eos 3. So our bos takes Marian's padding row (the decoder's start), our eos
    Marian's eos, our unk Marian's unk, and our pad is a new row that is never produced (logit bias
    :data:`NEVER_LOGIT`); the other entries follow in Marian's order.
    """
    names = {index: piece for piece, index in vocab.items()}
    if sorted(names) != list(range(size)):
        raise MarianImportError(
            f"{file} does not number 0..{size - 1} exactly once ({len(vocab)} entries; config.json says "
            f"{size} for this side)"
        )
    unk = vocab.get("<unk>")
    if None in (pad, eos, unk) or len({pad, eos, unk}) < 3 or not {pad, eos, unk} <= set(names):
        raise MarianImportError(
            f"{file}: need distinct pad, eos and <unk> ids within it, got pad={pad} eos={eos} unk={unk}"
        )
    order: list[int | None] = [None, unk, pad, eos]
    order += [index for index in range(size) if index not in (pad, eos, unk)]
    pieces = ["", "", "", ""] + [names[i] for i in order[4:]]
    misplaced = [piece for piece in pieces[4:] if piece in SPECIAL_PIECES.values()]
    if misplaced:  # e.g. a target <pad> that is not the decoder's start
        raise MarianImportError(
            f"{file} has {misplaced[0]!r} at id {vocab[misplaced[0]]}, but config.json gives that part to "
            f"no id there (pad_token_id={pad}, eos_token_id={eos})"
        )
    return Vocabulary(file=file, order=order, pieces=pieces)


def renumbered_rows(matrix: Tensor, order: list[int | None], fill: float) -> Tensor:
    """``matrix`` (V, ...) in our row order (V+1, ...): row i is Marian's ``order[i]``, ``fill`` at None."""
    index = torch.tensor([0 if i is None else i for i in order])
    rows = matrix.index_select(0, index).clone()
    rows[[i for i, m in enumerate(order) if m is None]] = fill
    return rows


def vocabulary_rows(name: str, matrix: Tensor, vocab: Vocabulary, fill: float = 0.0) -> Tensor:
    """Tensor ``name`` (one row per entry of ``vocab``) in our row order, float32; refused when its row
    count is not the vocabulary's."""
    if matrix.size(0) != len(vocab.order) - 1:
        raise MarianImportError(
            f"{name} has {matrix.size(0)} rows but {vocab.file} has {len(vocab.order) - 1} entries"
        )
    return renumbered_rows(matrix.float(), vocab.order, fill)


def language_tokens(vocab: Vocabulary) -> list[str]:
    """The target-language tokens of a source vocabulary (``>>fra<<``, ``>>pt_BR<<``), in id order: the
    entries ``MarianTokenizer`` splits off the start of a text before sentencepiece."""
    return [p for p in vocab.pieces[4:] if len(p) > 4 and p.startswith(">>") and p.endswith("<<")]


def tokenizers(
    marian: MarianModel, source: Vocabulary, target: Vocabulary
) -> tuple[list[Tokenizer], list[str]]:
    """Our (source, target) tokenizers: each sentencepiece model renumbered to its side's vocabulary (the
    source side writing the target-language tokens as one piece each), and notes on pieces a vocabulary
    lacks and on the language tokens."""
    notes, made = [], []
    codes = language_tokens(source)
    for side, proto, vocab in (("source", marian.src_spm, source), ("target", marian.tgt_spm, target)):
        renumbered = renumbered_model(proto, vocab.pieces, codes if side == "source" else ())
        if renumbered.symbols:
            shown = " ".join(renumbered.symbols[:8]) + (" ..." if len(renumbered.symbols) > 8 else "")
            notes.append(
                f"a multilingual model: name the target language (translate.py --tgt-lang "
                f"{renumbered.symbols[0][2:-2]}, the server's target_lang) or start each source with its "
                f"token, e.g. '{renumbered.symbols[0]} Text.' ({len(renumbered.symbols)} tokens: {shown})"
            )
        if renumbered.dropped:
            notes.append(
                f"{side}.spm has {len(renumbered.dropped)} pieces that {vocab.file} lacks (Marian reads them "
                f"as <unk>; here text is cut around them), e.g. {list(renumbered.dropped[:3])}"
            )
        made.append(Tokenizer.from_bytes(renumbered.model))
    return made, notes


def layer_names(prefix: str, index: int, decoder: bool) -> dict[str, str]:
    """Our parameter prefixes -> Hugging Face's, for one layer (``.weight`` / ``.bias`` follow)."""
    theirs = f"model.{prefix}.layers.{index}"
    ours = f"{prefix}.{index}"
    names = {f"{ours}.ffn.0": f"{theirs}.fc1", f"{ours}.ffn.3": f"{theirs}.fc2"}
    names[f"{ours}.ffn_block.norm"] = f"{theirs}.final_layer_norm"
    names[f"{ours}.{'self_block' if decoder else 'attn_block'}.norm"] = f"{theirs}.self_attn_layer_norm"
    sites = {"self_attn": "self_attn"}
    if decoder:
        sites["cross_attn"] = "encoder_attn"
        names[f"{ours}.cross_block.norm"] = f"{theirs}.encoder_attn_layer_norm"
    for site, their_site in sites.items():
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            names[f"{ours}.{site}.{proj}"] = f"{theirs}.{their_site}.{proj}"
    return names


def converted_weights(
    model: MarianModel, options: dict[str, Any], source: Vocabulary, target: Vocabulary
) -> dict[str, Tensor]:
    """Our state dict (without the ``model.`` prefix) from Marian's weights."""
    weights = model.weights
    names: dict[str, str] = {}
    for index in range(options["encoder_layers"]):
        names.update(layer_names("encoder", index, decoder=False))
    for index in range(options["decoder_layers"]):
        names.update(layer_names("decoder", index, decoder=True))
    ours = {}
    for mine, theirs in names.items():
        for part in ("weight", "bias"):
            if f"{theirs}.{part}" not in weights:
                raise MarianImportError(f"the weights lack {theirs}.{part}")
            ours[f"{mine}.{part}"] = weights[f"{theirs}.{part}"].float()
    ours.update(vocabulary_weights(model, source, target))
    check_positions(weights, options)
    return ours


def vocabulary_weights(model: MarianModel, source: Vocabulary, target: Vocabulary) -> dict[str, Tensor]:
    """The token embeddings, the output layer and its bias, rows in our order.

    Shared: ``model.shared`` (or the encoder's copy of it) is source, target and (tied) output embedding.
    Separate: the encoder's embedding over the source vocabulary, the decoder's over the target one, the
    output tied to the decoder's (``lm_head.weight`` where ``tie_word_embeddings`` is false), and
    ``final_logits_bias`` over the target vocabulary."""
    weights, tied = model.weights, model.config.get("tie_word_embeddings", True)
    keys = ("model.shared.weight", "model.encoder.embed_tokens.weight")
    if source is target:
        found = [key for key in keys if key in weights]
        keys = (found[0] if found else keys[0],) * 2
    else:
        keys = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight")
    missing = [key for key in keys if key not in weights]
    if missing:
        raise MarianImportError(f"the weights lack {missing[0]} (token embeddings)")
    src = vocabulary_rows(keys[0], weights[keys[0]], source)
    tgt = src if source is target else vocabulary_rows(keys[1], weights[keys[1]], target)
    head = "lm_head.weight" if not tied and "lm_head.weight" in weights else None
    output = tgt if head is None else vocabulary_rows(head, weights[head], target)
    bias = weights.get("final_logits_bias", torch.zeros(1, len(target.order) - 1))
    return {
        "src_embed.weight": src,
        "tgt_embed.weight": tgt,
        "output.weight": output,
        "output.bias": vocabulary_rows("final_logits_bias", bias[0], target, NEVER_LOGIT),
    }


def check_positions(weights: dict[str, Tensor], options: dict[str, Any]) -> None:
    """Refuse stored position embeddings that are not Marian's sinusoids (which we compute, not load)."""
    for side in ("encoder", "decoder"):
        stored = weights.get(f"model.{side}.embed_positions.weight")
        if stored is None:
            continue
        expected = sinusoid_table(stored.size(0), options["d_model"], "halves")
        if stored.shape != expected.shape or not torch.allclose(stored.float(), expected, atol=1e-5):
            raise MarianImportError(
                f"model.{side}.embed_positions.weight is not Marian's sinusoid table (learned positions?)"
            )


@dataclass
class Imported:
    """An imported model: its checkpoint dict and what a user should know about the conversion."""

    checkpoint: dict[str, Any]
    overrides: list[str]  # train.py overrides that build this model (for init_from fine-tuning)
    notes: list[str]


def import_marian(directory: str | os.PathLike[str], *, src_lang: str, tgt_lang: str) -> Imported:
    """The checkpoint of the Marian model in ``directory`` (see the module docstring)."""
    marian = read_marian_dir(directory)
    options = model_options(marian.config)
    source, target = vocabularies(marian)
    (src_tok, tgt_tok), notes = tokenizers(marian, source, target)
    overrides = marian_overrides(options, marian.config, src_lang=src_lang, tgt_lang=tgt_lang)
    directions, skipped = marian_directions(src_lang, language_tokens(source))
    if skipped:
        notes.append(f"language tokens that make no direction {src_lang}-CODE, so not asked for: {skipped}")
    if directions:  # the tags are written Marian's way in translation and in any tagged fine-tuning
        overrides.append(f"data.tag_format={json.dumps(MARIAN_TAGS)}")
    tagged = [f"data.directions=[{','.join(directions)}]"] if directions else []
    config = run_config(overrides + tagged, output_dir=str(Path(directory).resolve()))
    sizes = {"src_vocab_size": len(source.order), "tgt_vocab_size": len(target.order)}
    model = build_model(config["model"], config["attention"], **sizes, pad_id=0)
    try:
        model.load_state_dict(converted_weights(marian, options, source, target))
    except RuntimeError as err:
        raise MarianImportError(f"the weights do not fit the model config.json describes ({err})") from err
    checkpoint = model_checkpoint(model.eval(), config, src_tok, tgt_tok)
    checkpoint["translation"]["imported_from"] = {"format": "marian", "path": str(Path(directory).resolve())}
    return Imported(checkpoint=checkpoint, overrides=overrides, notes=notes)


def marian_overrides(
    options: dict[str, Any], config: dict[str, Any], *, src_lang: str, tgt_lang: str
) -> list[str]:
    """The train.py overrides of this Marian model: experiment=opus_mt and its sizes and languages."""
    values = {f"model.{key}": value for key, value in options.items()}
    values["attention.dropout"] = config.get("attention_dropout", 0.0)
    values["data.src_lang"], values["data.tgt_lang"] = src_lang, tgt_lang
    return ["experiment=opus_mt"] + [f"{key}={json.dumps(value)}" for key, value in values.items()]


def marian_directions(src_lang: str, tokens: list[str]) -> tuple[list[str], list[str]]:
    """A multilingual model's directions, one per target-language token (``>>fra<<`` -> ``en-fra``), and
    the tokens that make no direction name (the source language itself, characters a code lacks)."""
    directions, skipped = [], []
    for token in tokens:
        direction = f"{src_lang}-{token[2:-2]}"
        try:
            parse_direction(direction)
        except LanguageError:
            skipped.append(token)
            continue
        directions.append(direction)
    return directions, skipped


def run_config(overrides: list[str], *, output_dir: str) -> dict[str, Any]:
    """The resolved train config with ``overrides``, as a checkpoint stores it."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        composed = compose("train", overrides=[f"output_dir={output_dir}", *overrides])
    return OmegaConf.to_container(composed, resolve=True)  # type: ignore[return-value]


__all__ = ["Imported", "MarianImportError", "Vocabulary", "import_marian", "language_tokens", "vocabularies"]
