"""Reading a Hugging Face Marian (OPUS-MT) model directory as data: its files, checked and parsed.

A directory as ``save_pretrained`` writes it holds ``config.json``, ``model.safetensors`` or
``pytorch_model.bin``, ``source.spm``, ``target.spm`` and ``vocab.json``; a model with separate source and
target vocabularies (``share_encoder_decoder_embeddings: false``, e.g. the Tatoeba-Challenge
``opus-mt-tc-*`` models) also ``target_vocab.json``, and then ``vocab.json`` is the source side's only.
Nothing here runs what it reads: weights come from safetensors or ``torch.load(weights_only=True)``.
Turning the parts into our model is :mod:`app.interop.marian`'s work.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

REQUIRED_FILES = ("config.json", "source.spm", "target.spm", "vocab.json")
TARGET_VOCAB = "target_vocab.json"  # the target side's vocabulary, in separate-vocabulary models only
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


class MarianImportError(ValueError):
    """A directory that is not a Marian model this toolkit can rebuild; the message names what is wrong."""


@dataclass
class MarianModel:
    """A Marian directory's parts, read and checked."""

    config: dict[str, Any]  # config.json
    weights: dict[str, Tensor]  # the state dict, Hugging Face's names
    src_spm: bytes
    tgt_spm: bytes
    vocab: dict[str, int]  # vocab.json: piece -> Marian id (both sides, or the source side's alone)
    tgt_vocab: dict[str, int] | None = None  # target_vocab.json where the vocabularies are separate

    @property
    def shared(self) -> bool:
        """Whether source and target share one vocabulary and embedding (Marian's default)."""
        return bool(self.config.get("share_encoder_decoder_embeddings", True))


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
    config = read_json(root / "config.json")
    if config.get("model_type") != "marian":
        raise MarianImportError(
            f"{root}/config.json has model_type {config.get('model_type')!r}, not 'marian'"
        )
    model = MarianModel(
        config=config,
        weights=read_weights(root),
        src_spm=(root / "source.spm").read_bytes(),
        tgt_spm=(root / "target.spm").read_bytes(),
        vocab=read_vocab(root / "vocab.json"),
    )
    if not model.shared:
        if not (root / TARGET_VOCAB).is_file():
            raise MarianImportError(
                f"{root} lacks {TARGET_VOCAB}, the target vocabulary of a model with "
                "share_encoder_decoder_embeddings=false (separate source and target vocabularies)"
            )
        model.tgt_vocab = read_vocab(root / TARGET_VOCAB)
    return model


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``, or a :class:`MarianImportError` naming the file."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise MarianImportError(f"{path} is not valid JSON ({err})") from err
    if not isinstance(value, dict):
        raise MarianImportError(f"{path} holds a JSON {type(value).__name__}, expected an object")
    return value


def read_vocab(path: Path) -> dict[str, int]:
    """A Marian vocabulary file: a JSON object of piece -> integer id."""
    vocab = read_json(path)
    wrong = [piece for piece, index in vocab.items() if type(index) is not int]
    if wrong:
        raise MarianImportError(f"{path} maps {wrong[0]!r} to {vocab[wrong[0]]!r}, not an integer id")
    return vocab


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


def languages_from_name(directory: str | os.PathLike[str]) -> tuple[str, str] | None:
    """(source, target) from an OPUS-MT directory name such as ``opus-mt-de-en``, else None."""
    name = Path(directory).resolve().name
    parts = name.split("-")
    if len(parts) >= 4 and name.startswith("opus-mt-") and all(parts[-2:]):
        return parts[-2], parts[-1]
    return None


def download(name: str, directory: str | os.PathLike[str]) -> Path:
    """Fetch a model from the Hugging Face hub into ``directory`` (optional: ``huggingface_hub`` and a
    network); everything else works offline on a local directory."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError as err:
        raise MarianImportError(
            "--from-hub needs the huggingface_hub package (pip install huggingface_hub); or download the "
            "model directory yourself and pass its path"
        ) from err
    patterns = [*REQUIRED_FILES, TARGET_VOCAB, *WEIGHT_FILES]
    try:
        return Path(snapshot_download(repo_id=name, local_dir=str(directory), allow_patterns=patterns))
    except Exception as err:  # offline, unknown repository, refused: all the same to a user
        raise MarianImportError(
            f"could not download {name} from the Hugging Face hub ({type(err).__name__}: {err}); "
            "without network access, copy the model directory here and pass its path"
        ) from err
