"""The checkpoint format, in one place: what a checkpoint holds and how a model is rebuilt from it.

A checkpoint is Lightning's dict (``state_dict`` with a ``model.`` prefix, loop and optimizer state)
plus, under :data:`CHECKPOINT_KEY`, everything needed to use the model without the run directory:

    {"format_version": FORMAT_VERSION,
     "config": resolved run config (model, attention, data, ...),
     "src_spm": bytes, "tgt_spm": bytes,     # the sentencepiece models
     "valid_search": dict}                   # the decoding used for validation

Lightning's part is plain data too (loop counters, optimizer and scheduler states, callback states:
random generators as tensors, the SHA-256 of the data and tokenizers a resume checks against).

Training writes it (:func:`translation_payload` from the LightningModule), inference, scripts and tests
read it (:func:`load_model`), and :func:`model_checkpoint` builds a complete one from a model in memory.
Files are written atomically and read with clear errors. Nothing here imports Lightning.

Opening a checkpoint never runs code from it: every file is read with ``torch.load(weights_only=True)``,
which rebuilds tensors, numbers, strings, bytes, lists, tuples and dicts and nothing else. A file that
asks for anything more (a pickled object whose ``__reduce__`` would call a function, say) is refused
with a :class:`CheckpointError` before any of it is used.
"""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from app.data.tokenizer import Tokenizer, TokenizerError
from app.io import atomic_write, pickled_globals
from app.models import build_model
from app.models.limits import build_for_weights
from app.models.seq2seq import Seq2Seq

CHECKPOINT_KEY = "translation"  # where a checkpoint keeps the run config and the tokenizer models
FORMAT_VERSION = 1
"""The layout of :data:`CHECKPOINT_KEY` this version writes. Files without one (format 0, written
before the number existed) are read the same way; a newer number is refused, naming both."""


class CheckpointError(ValueError):
    """A checkpoint that is missing, truncated, corrupted, unsafe or from another program."""


def save_atomically(obj: Any, path: str | os.PathLike[str]) -> None:
    """``torch.save`` through :func:`app.io.atomic_write`: a crash at any point leaves either the old
    file or the new one, never a half-written file."""
    with atomic_write(path, "wb") as handle:
        torch.save(obj, handle)


def _numpy_array_globals() -> list[Any]:
    """What unpickling a plain numpy array needs: format-0 training checkpoints kept numpy's random
    state as one. Rebuilding an array calls no function a file can choose, and any object inside an
    object array still goes through the same weights-only unpickler, so this adds no way to run code."""
    try:
        from numpy._core.multiarray import _reconstruct  # numpy >= 2
    except ImportError:  # pragma: no cover - numpy 1.x
        from numpy.core.multiarray import _reconstruct
    return [
        np.ndarray,
        np.dtype,
        type(np.dtype(np.uint32)),
        _reconstruct,
        (_reconstruct, "numpy.core.multiarray._reconstruct"),  # written by numpy 1.x
    ]


@contextmanager
def _numpy_arrays_allowed() -> Iterator[None]:
    with torch.serialization.safe_globals(_numpy_array_globals()):
        yield


def _allowed_globals() -> set[str]:
    """``module.name`` of every global the weights-only unpickler accepts (torch's list and ours)."""
    from torch import _weights_only_unpickler as unpickler  # private; a guess without it is worse

    names = set(getattr(unpickler, "_get_allowed_globals", dict)())
    for entry in _numpy_array_globals():
        names.add(entry[1] if isinstance(entry, tuple) else f"{entry.__module__}.{entry.__qualname__}")
    return names


def _refusal_reason(err: pickle.UnpicklingError, path: Path) -> str | None:
    """The global (a class or function) a file asked for beyond plain data, or None when it names none
    (garbage: refused as "not a checkpoint"). Torch names it for protocol-2 pickles; for others (its
    unpickler stops at the first opcode of protocols 3-5) the file's opcodes are read without running."""
    found = re.search(r"unsupported GLOBAL (\S+?)(?: was not| whose|\.?\s|$)", str(err), re.IGNORECASE)
    if found:
        return f"GLOBAL {found.group(1)}"
    allowed = _allowed_globals()
    try:
        for name in pickled_globals(path):
            if name not in allowed:
                return f"GLOBAL {name}"
    except Exception:  # not a pickle past some point: what was read named nothing refused
        return None
    return None


def read_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a checkpoint dict, weights only, turning torch's failures into a :class:`CheckpointError`.

    Refused, each with the file named: a file that needs more than data to unpickle (it could run
    code), one from a newer format, one from another program, or one missing a part this toolkit needs.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        with _numpy_arrays_allowed():
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        reason = _refusal_reason(err, path)
        if reason is None:
            raise CheckpointError(
                f"{path} is truncated or not a checkpoint (UnpicklingError: {err})"
            ) from err
        raise CheckpointError(
            f"refused to open {path}: it holds more than weights and data ({reason}); unpickling it "
            f"could run code from the file. Only checkpoints written by train.py hold nothing else "
            f"(see 'Opening checkpoints from others' in README.md)"
        ) from err
    except Exception as err:  # the weights-only unpickler fails on garbage with any error type
        raise CheckpointError(
            f"{path} is truncated or not a checkpoint ({type(err).__name__}: {err})"
        ) from err
    if not isinstance(checkpoint, dict) or CHECKPOINT_KEY not in checkpoint or "state_dict" not in checkpoint:
        raise CheckpointError(f"{path} is not a checkpoint written by this toolkit's train.py")
    check_structure(checkpoint, source=str(path))
    return checkpoint


def last_learning_rate(path: str | os.PathLike[str]) -> float:
    """The learning rate a training run's checkpoint was last trained at (its scheduler's last rate, first
    parameter group), so that a run started from it can go on at that rate (uptraining,
    ``conf/experiment/ablation_uptrain.yaml``). A file without a scheduler's state names itself."""
    checkpoint = read_checkpoint(path)
    try:
        rate = checkpoint["lr_schedulers"][0]["_last_lr"][0]
    except (KeyError, IndexError, TypeError) as err:
        raise CheckpointError(
            f"{path} holds no learning-rate scheduler state (an averaged or exported checkpoint?): give the "
            "learning rate as a number instead"
        ) from err
    if not isinstance(rate, float) or not rate > 0:
        raise CheckpointError(f"{path}: its scheduler's last learning rate is {rate!r}, not a positive rate")
    return rate


# The parts every checkpoint must have, as (path of keys, expected type).
_REQUIRED: tuple[tuple[tuple[str, ...], type], ...] = (
    (("state_dict",), dict),
    ((CHECKPOINT_KEY,), dict),
    ((CHECKPOINT_KEY, "config"), dict),
    ((CHECKPOINT_KEY, "config", "model"), dict),
    ((CHECKPOINT_KEY, "config", "attention"), dict),
    ((CHECKPOINT_KEY, "src_spm"), bytes),
    ((CHECKPOINT_KEY, "tgt_spm"), bytes),
)


def check_structure(checkpoint: dict[str, Any], *, source: str = "checkpoint") -> None:
    """Raise a :class:`CheckpointError` naming the first missing or mistyped part, or a format newer
    than :data:`FORMAT_VERSION`."""
    for keys, kind in _REQUIRED:
        node: Any = checkpoint
        for depth, key in enumerate(keys):
            if not isinstance(node, dict) or key not in node:
                raise CheckpointError(
                    f"{source} has no {'.'.join(keys[: depth + 1])}: not a complete checkpoint"
                )
            node = node[key]
        if not isinstance(node, kind):
            raise CheckpointError(
                f"{source}: {'.'.join(keys)} is a {type(node).__name__}, expected a {kind.__name__}"
            )
    version = checkpoint[CHECKPOINT_KEY].get("format_version", 0)
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise CheckpointError(f"{source}: unknown checkpoint format_version {version!r}")
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"{source} has checkpoint format {version}, this version of the toolkit reads formats up to "
            f"{FORMAT_VERSION}: update the toolkit to open it"
        )
    bad = [name for name, value in checkpoint["state_dict"].items() if not isinstance(value, torch.Tensor)]
    if bad:
        raise CheckpointError(f"{source}: state_dict entries that are not tensors: {bad[:5]}")


@dataclass
class LoadedModel:
    """A model rebuilt from a checkpoint, with its tokenizers and the run config it was trained with."""

    model: Seq2Seq
    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer
    config: dict[str, Any]


def translation_payload(
    config: dict[str, Any],
    src_tokenizer: Tokenizer,
    tgt_tokenizer: Tokenizer,
    valid_search: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What a checkpoint keeps under :data:`CHECKPOINT_KEY` besides the weights."""
    return {
        "format_version": FORMAT_VERSION,
        "config": config,
        "src_spm": src_tokenizer.to_bytes(),
        "tgt_spm": tgt_tokenizer.to_bytes(),
        "valid_search": dict(valid_search or {}),
    }


def model_checkpoint(
    model: Seq2Seq,
    config: dict[str, Any],
    src_tokenizer: Tokenizer,
    tgt_tokenizer: Tokenizer,
    *,
    global_step: int = 0,
    epoch: int = 0,
) -> dict[str, Any]:
    """A complete weights-only checkpoint of ``model`` (no optimizer state) that :func:`load_model` reads."""
    return {
        "epoch": epoch,
        "global_step": global_step,
        "state_dict": {f"model.{name}": value for name, value in model.state_dict().items()},
        CHECKPOINT_KEY: translation_payload(config, src_tokenizer, tgt_tokenizer),
    }


def _tokenizer(extra: dict[str, Any], key: str, source: str) -> Tokenizer:
    """The tokenizer stored under ``extra[key]``, or a :class:`CheckpointError` naming ``source``."""
    try:
        return Tokenizer.from_bytes(extra[key])
    except TokenizerError as err:  # malformed, oversized, other special ids
        raise CheckpointError(
            f"{source}: its sentencepiece model {CHECKPOINT_KEY}.{key} is refused: {err}"
        ) from err


def model_from_checkpoint(checkpoint: dict[str, Any], *, source: str = "checkpoint") -> LoadedModel:
    """Rebuild the model a checkpoint dict describes and load its weights (on CPU, in eval mode).

    The config's sizes are bounded and the build may allocate only about what the file's weights
    occupy (:func:`app.models.limits.build_for_weights`): a config that asks for more than its file
    holds is refused before it costs more, whatever it says."""
    extra = checkpoint[CHECKPOINT_KEY]
    config = extra["config"]
    src_tok, tgt_tok = _tokenizer(extra, "src_spm", source), _tokenizer(extra, "tgt_spm", source)

    def build() -> Seq2Seq:
        return build_model(
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
        model = build_for_weights(build, weights)
    except ValueError as err:  # out-of-bounds sizes, weights that do not fit, an unknown setting
        raise CheckpointError(f"{source}: {err}") from err
    try:
        model.load_state_dict(weights)
    except RuntimeError as err:  # e.g. written by a version whose layer layout differed
        raise CheckpointError(
            f"{source}: the weights do not fit the model its config describes ({err})"
        ) from err
    return LoadedModel(model.eval(), src_tok, tgt_tok, config)


def load_model(path: str | os.PathLike[str], device: str | torch.device = "cpu") -> LoadedModel:
    """The model stored in checkpoint ``path``, on ``device`` and in eval mode."""
    loaded = model_from_checkpoint(read_checkpoint(path), source=str(path))
    loaded.model.to(device)
    return loaded


_STEP_FILE = re.compile(r"step-(\d+)\.ckpt$")


def step_checkpoints(directory: str | os.PathLike[str]) -> list[Path]:
    """The ``step-<step>.ckpt`` files in ``directory`` (``checkpoint.keep_last`` keeps them), oldest first."""
    found = [(int(m.group(1)), p) for p in Path(directory).iterdir() if (m := _STEP_FILE.search(p.name))]
    return [path for _, path in sorted(found)]


def checkpoints_to_average(inputs: list[Path], last: int | None = None) -> list[Path]:
    """What to average: the files as given, or a run's step checkpoints given its checkpoints directory;
    of these the newest ``last`` (all when None). Raises :class:`CheckpointError` for a directory without
    step checkpoints and ValueError for ``last < 1``."""
    if len(inputs) == 1 and inputs[0].is_dir():
        paths = step_checkpoints(inputs[0])
        if not paths:
            raise CheckpointError(f"no step-<step>.ckpt in {inputs[0]} (train with checkpoint.keep_last>0)")
    else:
        paths = list(inputs)
    if last is not None:
        if last < 1:
            raise ValueError(f"--last must be >= 1, got {last}")
        paths = paths[-last:]
    return paths


def average_checkpoints(paths: list[str | os.PathLike[str]]) -> dict[str, Any]:
    """A weights-only checkpoint whose parameters are the mean of those in ``paths``.

    Averaging the last checkpoints of a run (Vaswani et al. 2017, section 6.1: the last 5 or 20) smooths
    out the noise of the final updates and usually gains a little BLEU. The files are read one at a
    time into a running sum (float64 for floating-point tensors, divided at the end and cast back), so
    memory holds the sum and one checkpoint however many are averaged; integer buffers must agree. The
    result keeps the newest checkpoint's config and tokenizers (so ``translate.py`` reads it) but no
    optimizer or loop state: training cannot resume from it.
    """
    if not paths:
        raise ValueError("average_checkpoints needs at least one checkpoint")
    total: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    newest: dict[str, Any] = {}
    for index, path in enumerate(paths):
        checkpoint = read_checkpoint(path)
        weights = checkpoint["state_dict"]
        newest = {key: checkpoint.get(key) for key in ("global_step", "epoch", CHECKPOINT_KEY)}
        del checkpoint  # its optimizer and loop state go now, not when the next file is read
        if index == 0:
            dtypes = {name: value.dtype for name, value in weights.items()}
            total = {name: _start_sum(value) for name, value in weights.items()}
        else:
            _add_to_sum(total, weights, source=f"{path} (against {paths[0]})")
        del weights
    averaged = {
        name: (value / len(paths)).to(dtypes[name]) if value.is_floating_point() else value
        for name, value in total.items()
    }
    return {
        "state_dict": averaged,
        "global_step": newest["global_step"],
        "epoch": newest["epoch"],
        CHECKPOINT_KEY: {**newest[CHECKPOINT_KEY], "averaged_from": [str(p) for p in paths]},
    }


def _start_sum(value: torch.Tensor) -> torch.Tensor:
    """A running sum's first term: a float64 copy of a floating-point tensor, a copy of an integer one."""
    return value.to(torch.float64, copy=True) if value.is_floating_point() else value.clone()


def _add_to_sum(total: dict[str, torch.Tensor], weights: dict[str, torch.Tensor], *, source: str) -> None:
    """Add one checkpoint's ``weights`` to ``total`` in place; integer buffers must equal the first's."""
    if list(weights) != list(total):
        raise CheckpointError(f"{source} holds different parameters: cannot average them")
    for name, value in weights.items():
        if value.shape != total[name].shape:
            raise CheckpointError(
                f"parameter {name} has shape {tuple(value.shape)} in {source}, "
                f"{tuple(total[name].shape)} in the first"
            )
        if total[name].is_floating_point():
            total[name] += value.to(torch.float64)
        elif not torch.equal(value, total[name]):
            raise CheckpointError(f"integer buffer {name} differs in {source}: cannot average it")
