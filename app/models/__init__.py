"""Model families and the registry that builds them from the ``model`` config group."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from app.attention.config import rnn_attention, site_specs
from app.models.limits import check_sizes
from app.models.rnn import RNNSeq2Seq
from app.models.seq2seq import DecoderState, EncoderOutput, Seq2Seq
from app.models.transformer import Transformer


def _build_transformer(
    options: dict[str, Any],
    attention: Mapping[str, Any],
    *,
    src_vocab_size: int,
    tgt_vocab_size: int,
    pad_id: int,
) -> Seq2Seq:
    return Transformer(
        src_vocab_size=src_vocab_size,
        tgt_vocab_size=tgt_vocab_size,
        pad_id=pad_id,
        attention=site_specs(attention, max_positions=options.get("max_positions")),
        **options,
    )


def _build_rnn(
    options: dict[str, Any],
    attention: Mapping[str, Any],
    *,
    src_vocab_size: int,
    tgt_vocab_size: int,
    pad_id: int,
) -> Seq2Seq:
    return RNNSeq2Seq(
        src_vocab_size=src_vocab_size,
        tgt_vocab_size=tgt_vocab_size,
        pad_id=pad_id,
        attention=rnn_attention(attention),
        **options,
    )


MODEL_BUILDERS: dict[str, Callable[..., Seq2Seq]] = {"transformer": _build_transformer, "rnn": _build_rnn}
MODEL_CLASSES: dict[str, type[Seq2Seq]] = {"transformer": Transformer, "rnn": RNNSeq2Seq}


def packing_families() -> list[str]:
    """The model families that train on packed batches (``data.layout=packed``), by their class's
    ``packs_batches``."""
    return sorted(family for family, model in MODEL_CLASSES.items() if model.packs_batches)


def build_model(
    model_cfg: Mapping[str, Any],
    attention_cfg: Mapping[str, Any],
    *,
    src_vocab_size: int,
    tgt_vocab_size: int,
    pad_id: int,
) -> Seq2Seq:
    """Build the model named by ``model_cfg.family`` with the remaining keys as its settings, which must
    stay under :data:`app.models.limits.SIZE_BOUNDS` (a ValueError names the first that does not)."""
    check_sizes(model_cfg)
    options = dict(model_cfg)
    family = options.pop("family", None)
    if family not in MODEL_BUILDERS:
        raise ValueError(
            f"unknown model family {family!r}; valid choices: {', '.join(sorted(MODEL_BUILDERS))}"
        )
    try:
        return MODEL_BUILDERS[family](
            options,
            attention_cfg,
            src_vocab_size=src_vocab_size,
            tgt_vocab_size=tgt_vocab_size,
            pad_id=pad_id,
        )
    except TypeError as err:
        raise ValueError(f"bad setting for model family {family!r}: {err}") from err


__all__ = [
    "MODEL_BUILDERS",
    "MODEL_CLASSES",
    "DecoderState",
    "EncoderOutput",
    "RNNSeq2Seq",
    "Seq2Seq",
    "Transformer",
    "build_model",
    "packing_families",
]
