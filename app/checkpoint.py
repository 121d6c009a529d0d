"""Self-contained checkpoints: written atomically, loaded with clear errors.

A checkpoint holds the weights, the resolved run config and both sentencepiece models, so
``translate.py`` needs nothing but the file.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch

from app.data.tokenizer import Tokenizer
from app.models import build_model
from app.translator import Translator

CHECKPOINT_KEY = "translation"  # where a checkpoint keeps the run config and the tokenizer models


class CheckpointError(ValueError):
    """A checkpoint that is missing, truncated, corrupted or from another program."""


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def save_atomically(obj: Any, path: str | os.PathLike[str]) -> None:
    """``torch.save`` to a temporary file in the same directory, then rename over ``path``.

    A crash at any point leaves either the old file or the new one, never a half-written file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_current_umask())  # mkstemp makes 0600; follow the umask like open() does
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a checkpoint dict, turning torch's low-level failures into a :class:`CheckpointError`."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError) as err:
        raise CheckpointError(
            f"{path} is truncated or not a checkpoint ({type(err).__name__}: {err})"
        ) from err
    if not isinstance(checkpoint, dict) or CHECKPOINT_KEY not in checkpoint or "state_dict" not in checkpoint:
        raise CheckpointError(f"{path} is not a checkpoint written by this toolkit's train.py")
    return checkpoint


def load_translator(
    path: str | os.PathLike[str], device: str | torch.device = "cpu"
) -> tuple[Translator, dict]:
    """A ready :class:`Translator` and the run config stored in checkpoint ``path``."""
    checkpoint = read_checkpoint(path)
    extra = checkpoint[CHECKPOINT_KEY]
    config = extra["config"]
    src_tok, tgt_tok = Tokenizer.from_bytes(extra["src_spm"]), Tokenizer.from_bytes(extra["tgt_spm"])
    model = build_model(
        config["model"],
        config["attention"],
        src_vocab_size=src_tok.vocab_size,
        tgt_vocab_size=tgt_tok.vocab_size,
        pad_id=tgt_tok.pad_id,
    )
    weights = {
        k.removeprefix("model."): v for k, v in checkpoint["state_dict"].items() if k.startswith("model.")
    }
    try:
        model.load_state_dict(weights)
    except RuntimeError as err:  # e.g. written by a version whose layer layout differed
        raise CheckpointError(
            f"{path}: the weights do not fit the model its config describes ({err})"
        ) from err
    model.to(device).eval()
    return Translator(model, src_tok, tgt_tok), config


def average_checkpoints(paths: list[str | os.PathLike[str]]) -> dict[str, Any]:
    """A weights-only checkpoint whose parameters are the mean of those in ``paths``.

    Averaging the last checkpoints of a run (Vaswani et al. 2017, section 6.1: the last 5 or 20) smooths
    out the noise of the final updates and usually gains a little BLEU. Floating-point tensors are
    averaged in float64 and cast back; integer buffers must agree. The result keeps the newest
    checkpoint's config and tokenizers (so ``translate.py`` reads it) but no optimizer or loop state:
    training cannot resume from it.
    """
    if not paths:
        raise ValueError("average_checkpoints needs at least one checkpoint")
    checkpoints = [read_checkpoint(path) for path in paths]
    names = list(checkpoints[-1]["state_dict"])
    for path, checkpoint in zip(paths, checkpoints, strict=True):
        if list(checkpoint["state_dict"]) != names:
            raise CheckpointError(f"{path} holds different parameters than {paths[-1]}: cannot average them")
    averaged = {name: _mean_tensor(name, [c["state_dict"][name] for c in checkpoints]) for name in names}
    newest = checkpoints[-1]
    return {
        "state_dict": averaged,
        "global_step": newest.get("global_step"),
        "epoch": newest.get("epoch"),
        CHECKPOINT_KEY: {**newest[CHECKPOINT_KEY], "averaged_from": [str(p) for p in paths]},
    }


def _mean_tensor(name: str, tensors: list[torch.Tensor]) -> torch.Tensor:
    first = tensors[0]
    if any(t.shape != first.shape for t in tensors):
        raise CheckpointError(f"parameter {name} has shapes {[tuple(t.shape) for t in tensors]}")
    if not first.is_floating_point():
        if any(not torch.equal(t, first) for t in tensors):
            raise CheckpointError(f"integer buffer {name} differs between checkpoints: cannot average it")
        return first.clone()
    total = torch.zeros_like(first, dtype=torch.float64)
    for tensor in tensors:
        total += tensor.to(torch.float64)
    return (total / len(tensors)).to(first.dtype)
