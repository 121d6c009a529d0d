"""Config composition of the rnn family: its default attention, the four attention options, refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from app.attention import AttentionConfigError
from app.attention.additive import AdditiveAttention
from app.attention.luong import ConcatAttention, DotAttention, GeneralAttention
from app.models import ATTENTION_OPTIONS, RNNSeq2Seq, Transformer, build_model
from app.models.rnn_decoder import BahdanauDecoder, LuongDecoder
from tests.test_configs import CONF_DIR, SMALL_MODEL, SMALL_RNN, compose_train

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def build(*overrides: str, tmp_path: Path, vocab: int = 50):
    cfg = compose_train(*overrides, tmp_path=tmp_path, hydra_config=True)
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    attention_cfg = OmegaConf.to_container(cfg.attention, resolve=True)
    model = build_model(model_cfg, attention_cfg, src_vocab_size=vocab, tgt_vocab_size=vocab, pad_id=0)
    return cfg, model


def test_attention_options_of_each_family_are_the_config_files() -> None:
    files = {p.stem for p in (CONF_DIR / "attention").glob("*.yaml")}
    rnn, transformer = set(ATTENTION_OPTIONS["rnn"]), set(ATTENTION_OPTIONS["transformer"])
    assert rnn | transformer == files and not rnn & transformer
    for option in files:
        keys = set(OmegaConf.load(CONF_DIR / "attention" / f"{option}.yaml"))
        if option in rnn:
            assert {"mechanism", "decoder"} <= keys and "kernel" not in keys, option
        elif "kernel" not in keys:  # gqa / mqa inherit theirs through their defaults list
            assert "defaults" in keys and "mechanism" not in keys, option


def test_model_rnn_alone_uses_bahdanau_attention(tmp_path: Path) -> None:
    cfg, model = build("model=rnn", *SMALL_RNN, tmp_path=tmp_path)
    assert cfg.hydra.runtime.choices["attention"] == "additive"
    assert isinstance(model, RNNSeq2Seq) and isinstance(model.decoder, BahdanauDecoder)
    assert isinstance(model.decoder.attention, AdditiveAttention)


def test_default_model_keeps_multi_head_attention(tmp_path: Path) -> None:
    cfg, model = build(*SMALL_MODEL, tmp_path=tmp_path)
    assert cfg.hydra.runtime.choices["attention"] == "mha"
    assert isinstance(model, Transformer)


@pytest.mark.parametrize(
    ("option", "mechanism"),
    [("luong_dot", DotAttention), ("luong_general", GeneralAttention), ("luong_concat", ConcatAttention)],
)
def test_luong_options_build_a_luong_decoder_with_input_feeding(option: str, mechanism: type, tmp_path: Path):
    cfg, model = build("model=rnn", f"attention={option}", *SMALL_RNN, tmp_path=tmp_path)
    assert cfg.hydra.runtime.choices["attention"] == option
    assert isinstance(model.decoder, LuongDecoder) and model.decoder.input_feeding
    assert isinstance(model.decoder.attention, mechanism)
    _, no_feeding = build(
        "model=rnn", f"attention={option}", "attention.input_feeding=false", *SMALL_RNN, tmp_path=tmp_path
    )
    assert not no_feeding.decoder.input_feeding


def test_attention_size_is_a_flat_option(tmp_path: Path) -> None:
    _, model = build("model=rnn", "attention.attention_size=7", *SMALL_RNN, tmp_path=tmp_path)
    assert model.decoder.attention.energy.in_features == 7


@pytest.mark.parametrize("option", ATTENTION_OPTIONS["transformer"])
def test_transformer_attention_on_the_rnn_stops_with_the_valid_choices(option: str, tmp_path: Path) -> None:
    with pytest.raises(
        AttentionConfigError,
        match=r"belongs to the transformer model family and does not fit model=rnn; valid choices for "
        r"model=rnn: attention=additive \| luong_dot \| luong_general \| luong_concat",
    ):
        build("model=rnn", f"attention={option}", *SMALL_RNN, tmp_path=tmp_path)


@pytest.mark.parametrize("option", ATTENTION_OPTIONS["rnn"])
def test_rnn_attention_on_the_transformer_stops_with_the_valid_choices(option: str, tmp_path: Path) -> None:
    with pytest.raises(
        AttentionConfigError,
        match=r"belongs to the rnn model family and does not fit model=transformer; valid choices for "
        r"model=transformer: attention=mha \| sdpa \| flash \| sparse \| linear \| gqa \| mqa",
    ):
        build(f"attention={option}", *SMALL_MODEL, tmp_path=tmp_path)


def test_rnn_experiment_is_a_bahdanau_lstm_of_about_five_million_parameters(tmp_path: Path) -> None:
    cfg, model = build("experiment=multi30k_rnn", tmp_path=tmp_path, vocab=8000)
    assert cfg.hydra.runtime.choices["model"] == "rnn"
    assert cfg.hydra.runtime.choices["attention"] == "additive"
    assert isinstance(model.encoder.rnn, torch.nn.LSTM)
    assert 4_000_000 < model.num_parameters() < 5_500_000
    cfg, model = build("experiment=multi30k_rnn", "attention=luong_general", tmp_path=tmp_path, vocab=8000)
    assert isinstance(model.decoder.attention, GeneralAttention)
