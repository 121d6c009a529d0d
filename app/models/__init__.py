"""Model families and the registry that builds them from the ``model`` config group."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from app.attention.factory import site_specs
from app.attention.registry import AttentionConfigError
from app.models.rnn import RNNSeq2Seq, split_attention_config
from app.models.seq2seq import DecoderState, EncoderOutput, Seq2Seq
from app.models.transformer import Transformer

# The ``attention`` config options each family accepts (conf/attention/*.yaml; a test keeps them in sync).
# Transformer options set a ``kernel``; RNN options set a ``mechanism`` and a ``decoder``.
ATTENTION_OPTIONS: dict[str, tuple[str, ...]] = {
    "transformer": ("mha", "sdpa", "flash", "sparse", "linear", "gqa", "mqa"),
    "rnn": ("additive", "luong_dot", "luong_general", "luong_concat"),
}
_FAMILY_KEY = {"transformer": "kernel", "rnn": "mechanism"}  # the key that marks each family's attention


def check_attention_family(family: str, attention: Mapping[str, Any]) -> None:
    """Stop with the valid choices when ``attention`` was written for the other model family."""
    other = next((f for f, key in _FAMILY_KEY.items() if f != family and key in attention), None)
    if other is None or _FAMILY_KEY[family] in attention:
        return
    given = f"{_FAMILY_KEY[other]}={attention[_FAMILY_KEY[other]]!r}"
    raise AttentionConfigError(
        f"attention {given} belongs to the {other} model family and does not fit model={family}; "
        f"valid choices for model={family}: attention={' | '.join(ATTENTION_OPTIONS[family])}"
    )


def _build_transformer(
    options: dict[str, Any],
    attention: Mapping[str, Any],
    *,
    src_vocab_size: int,
    tgt_vocab_size: int,
    pad_id: int,
) -> Seq2Seq:
    check_attention_family("transformer", attention)
    return Transformer(
        src_vocab_size=src_vocab_size,
        tgt_vocab_size=tgt_vocab_size,
        pad_id=pad_id,
        attention=site_specs(attention),
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
    check_attention_family("rnn", attention)
    decoder, mechanism, mechanism_options, decoder_options = split_attention_config(attention)
    return RNNSeq2Seq(
        src_vocab_size=src_vocab_size,
        tgt_vocab_size=tgt_vocab_size,
        pad_id=pad_id,
        decoder=decoder,
        mechanism=mechanism,
        attention_options=mechanism_options,
        decoder_options=decoder_options,
        **options,
    )


MODEL_BUILDERS: dict[str, Callable[..., Seq2Seq]] = {"transformer": _build_transformer, "rnn": _build_rnn}


def build_model(
    model_cfg: Mapping[str, Any],
    attention_cfg: Mapping[str, Any],
    *,
    src_vocab_size: int,
    tgt_vocab_size: int,
    pad_id: int,
) -> Seq2Seq:
    """Build the model named by ``model_cfg.family`` with the remaining keys as its settings."""
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
    "ATTENTION_OPTIONS",
    "MODEL_BUILDERS",
    "DecoderState",
    "EncoderOutput",
    "RNNSeq2Seq",
    "Seq2Seq",
    "Transformer",
    "build_model",
    "check_attention_family",
]
