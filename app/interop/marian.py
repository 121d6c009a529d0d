"""Marian / OPUS-MT models (Hugging Face's ``MarianMTModel`` directories) as checkpoints of this toolkit.

A directory as ``save_pretrained`` writes it (``config.json``, ``model.safetensors`` or
``pytorch_model.bin``, ``source.spm``, ``target.spm``, ``vocab.json``) becomes a checkpoint that
``translate.py``, the server, the CTranslate2 export and ``init_from`` take like any trained here. Nothing
is special-cased downstream: the architecture is this toolkit's Transformer with the options Marian needs
(``conf/model/marian.yaml``: post-norm, swish, sines-then-cosines positions, a bias on the logits), and the
vocabulary is renumbered to our fixed special ids (:func:`vocabulary_order`).

The files are read as data only: safetensors, or ``torch.load(weights_only=True)`` for a ``.bin``.
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
from app.data.tokenizer import Tokenizer
from app.interop.spm_vocab import renumbered_model
from app.models import build_model
from app.models.embeddings import sinusoid_table

log = logging.getLogger(__name__)

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
REQUIRED_FILES = ("config.json", "source.spm", "target.spm", "vocab.json")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
ACTIVATIONS = {"swish": "swish", "silu": "swish", "gelu": "gelu", "relu": "relu"}  # Hugging Face's -> ours
NEVER_LOGIT = -1.0e4
"""The logit bias of our padding id, which Marian's vocabulary lacks (see :func:`vocabulary_order`): its
probability underflows to exactly 0 in float32, so every other token's log-probability is Marian's."""


class MarianImportError(ValueError):
    """A directory that is not a Marian model this toolkit can rebuild; the message names what is wrong."""


@dataclass
class MarianModel:
    """A Marian directory's parts, read and checked."""

    config: dict[str, Any]  # config.json
    weights: dict[str, Tensor]  # the state dict, Hugging Face's names
    src_spm: bytes
    tgt_spm: bytes
    vocab: dict[str, int]  # vocab.json: piece -> Marian id


def check_marian_dir(directory: str | os.PathLike[str]) -> Path:
    """``directory`` as a path, refused when it is not a directory with a Marian model's files."""
    root = Path(directory)
    if not root.is_dir():
        raise MarianImportError(f"{root} is not a directory (expected a Hugging Face Marian model directory)")
    missing = [name for name in REQUIRED_FILES if not (root / name).is_file()]
    if missing:
        raise MarianImportError(f"{root} lacks {', '.join(missing)}: not a Marian (OPUS-MT) model directory")
    return root


def read_marian_dir(directory: str | os.PathLike[str]) -> MarianModel:
    """Read a Marian model directory, refusing a missing file or a weights file that is more than data."""
    root = check_marian_dir(directory)
    config = json.loads((root / "config.json").read_text(encoding="utf-8"))
    if config.get("model_type") != "marian":
        raise MarianImportError(
            f"{root}/config.json has model_type {config.get('model_type')!r}, not 'marian'"
        )
    vocab = json.loads((root / "vocab.json").read_text(encoding="utf-8"))
    return MarianModel(
        config=config,
        weights=read_weights(root),
        src_spm=(root / "source.spm").read_bytes(),
        tgt_spm=(root / "target.spm").read_bytes(),
        vocab={str(piece): int(index) for piece, index in vocab.items()},
    )


def read_weights(root: Path) -> dict[str, Tensor]:
    """The state dict from safetensors (preferred) or a ``.bin`` opened weights-only, never unpickled."""
    if (root / WEIGHT_FILES[0]).is_file():
        try:
            from safetensors.torch import load_file
        except ImportError as err:
            raise MarianImportError(
                f"{root / WEIGHT_FILES[0]} needs the safetensors package: pip install -e '.[marian]'"
            ) from err
        return load_file(root / WEIGHT_FILES[0])
    path = root / WEIGHT_FILES[1]
    if not path.is_file():
        raise MarianImportError(f"{root} holds no weights: expected {' or '.join(WEIGHT_FILES)}")
    try:
        weights = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # the weights-only unpickler refuses code with any error type
        raise MarianImportError(
            f"refused to read {path} as weights only ({type(err).__name__}: {err})"
        ) from err
    if not isinstance(weights, dict) or not all(isinstance(v, Tensor) for v in weights.values()):
        raise MarianImportError(f"{path} is not a state dict of tensors")
    return weights


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
    if get("decoder_vocab_size") not in (None, get("vocab_size")):
        mismatched.append(
            f"decoder_vocab_size={get('decoder_vocab_size')} but vocab_size={get('vocab_size')}"
        )
    if not get("share_encoder_decoder_embeddings", True):
        mismatched.append("share_encoder_decoder_embeddings=false (separate source/target vocabularies)")
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
    return {
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


def vocabulary_order(vocab: dict[str, int], config: dict[str, Any]) -> tuple[list[int | None], list[str]]:
    """Marian's id at each of our ids (None: our padding, which Marian lacks) and the piece names.

    Marian's vocabulary has eos 0, unk 1 and its padding last, and starts decoding from the padding; ours
    has pad 0, unk 1, bos 2, eos 3. So our bos takes Marian's padding row (the decoder's start), our eos
    Marian's eos, our unk Marian's unk, and our pad is a new row that is never produced (logit bias
    :data:`NEVER_LOGIT`); the other entries follow in Marian's order.
    """
    size = config.get("vocab_size", len(vocab))
    names = {index: piece for piece, index in vocab.items()}
    if sorted(names) != list(range(size)):
        raise MarianImportError(f"vocab.json does not number 0..{size - 1} exactly once (config vocab_size)")
    pad, eos, unk = config.get("pad_token_id"), config.get("eos_token_id"), vocab.get("<unk>")
    if isinstance(eos, list):
        eos = eos[0]
    if None in (pad, eos, unk) or len({pad, eos, unk}) < 3:
        raise MarianImportError(f"need distinct pad, eos and <unk> ids, got pad={pad} eos={eos} unk={unk}")
    order: list[int | None] = [None, unk, pad, eos]
    order += [index for index in range(size) if index not in (pad, eos, unk)]
    return order, ["", "", "", ""] + [names[index] for index in order[4:]]


def renumbered_rows(matrix: Tensor, order: list[int | None], fill: float) -> Tensor:
    """``matrix`` (V, ...) in our row order (V+1, ...): row i is Marian's ``order[i]``, ``fill`` at None."""
    index = torch.tensor([0 if i is None else i for i in order])
    rows = matrix.index_select(0, index).clone()
    rows[[i for i, m in enumerate(order) if m is None]] = fill
    return rows


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
    model: MarianModel, options: dict[str, Any], order: list[int | None]
) -> dict[str, Tensor]:
    """Our state dict (without the ``model.`` prefix) from Marian's weights."""
    weights, config = model.weights, model.config
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
    shared = weights.get("model.shared.weight", weights.get("model.encoder.embed_tokens.weight"))
    if shared is None:
        raise MarianImportError("the weights lack model.shared.weight (the shared token embeddings)")
    embedding = renumbered_rows(shared.float(), order, 0.0)
    ours["src_embed.weight"] = ours["tgt_embed.weight"] = embedding
    head = weights.get("lm_head.weight", shared) if not config.get("tie_word_embeddings", True) else shared
    ours["output.weight"] = embedding if head is shared else renumbered_rows(head.float(), order, 0.0)
    bias = weights.get("final_logits_bias", torch.zeros(1, shared.size(0)))[0].float()
    ours["output.bias"] = renumbered_rows(bias, order, NEVER_LOGIT)
    check_positions(weights, options)
    return ours


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
    order, pieces = vocabulary_order(marian.vocab, marian.config)
    notes = []
    tokenizers = []
    for side, proto in (("source", marian.src_spm), ("target", marian.tgt_spm)):
        renumbered = renumbered_model(proto, pieces)
        if renumbered.dropped:
            notes.append(
                f"{side}.spm has {len(renumbered.dropped)} pieces that vocab.json lacks (Marian reads them "
                f"as <unk>; here text is cut around them), e.g. {list(renumbered.dropped[:3])}"
            )
        tokenizers.append(Tokenizer.from_bytes(renumbered.model))
    overrides = marian_overrides(options, marian.config, src_lang=src_lang, tgt_lang=tgt_lang)
    config = run_config(overrides, output_dir=str(Path(directory).resolve()))
    model = build_model(
        config["model"], config["attention"], src_vocab_size=len(order), tgt_vocab_size=len(order), pad_id=0
    )
    try:
        model.load_state_dict(converted_weights(marian, options, order))
    except RuntimeError as err:
        raise MarianImportError(f"the weights do not fit the model config.json describes ({err})") from err
    checkpoint = model_checkpoint(model.eval(), config, tokenizers[0], tokenizers[1])
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


def run_config(overrides: list[str], *, output_dir: str) -> dict[str, Any]:
    """The resolved train config with ``overrides``, as a checkpoint stores it."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        composed = compose("train", overrides=[f"output_dir={output_dir}", *overrides])
    return OmegaConf.to_container(composed, resolve=True)  # type: ignore[return-value]


def languages_from_name(directory: str | os.PathLike[str]) -> tuple[str, str] | None:
    """(source, target) from an OPUS-MT directory name such as ``opus-mt-de-en``, else None."""
    name = Path(directory).resolve().name
    parts = name.split("-")
    if len(parts) >= 4 and name.startswith("opus-mt-") and all(parts[-2:]):
        return parts[-2], parts[-1]
    return None


def download(name: str, directory: str | os.PathLike[str]) -> Path:
    """Fetch a model from the Hugging Face hub into ``directory`` (optional: ``huggingface_hub`` and a
    network); everything else in this module works offline on a local directory."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError as err:
        raise MarianImportError(
            "--from-hub needs the huggingface_hub package (pip install huggingface_hub); or download the "
            "model directory yourself and pass its path"
        ) from err
    patterns = [*REQUIRED_FILES, *WEIGHT_FILES]
    try:
        return Path(snapshot_download(repo_id=name, local_dir=str(directory), allow_patterns=patterns))
    except Exception as err:  # offline, unknown repository, refused: all the same to a user
        raise MarianImportError(
            f"could not download {name} from the Hugging Face hub ({type(err).__name__}: {err}); "
            "without network access, copy the model directory here and pass its path"
        ) from err


__all__ = [
    "Imported",
    "MarianImportError",
    "check_marian_dir",
    "download",
    "import_marian",
    "languages_from_name",
]
