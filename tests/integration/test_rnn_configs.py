"""Config composition of the rnn family: its default attention, the four attention options, refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.configs import CONF_DIR, RNN_ATTENTION, SMALL_MODEL, SMALL_RNN, compose_config
from omegaconf import OmegaConf

from app.attention import AttentionConfigError, available_kernels, available_mechanisms
from app.attention.additive import AdditiveAttention
from app.attention.luong import ConcatAttention, DotAttention, GeneralAttention
from app.models import RNNSeq2Seq, Transformer, build_model
from app.models.rnn_decoder import BahdanauDecoder, LuongDecoder

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def build(*overrides: str, tmp_path: Path, vocab: int = 50):
    cfg = compose_config(*overrides, tmp_path=tmp_path, hydra_config=True)
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    attention_cfg = OmegaConf.to_container(cfg.attention, resolve=True)
    model = build_model(model_cfg, attention_cfg, src_vocab_size=vocab, tgt_vocab_size=vocab, pad_id=0)
    return cfg, model


def test_attention_options_of_each_family_are_the_registered_ones() -> None:
    """One file per registered kernel (named after it), one or more per registered mechanism, and
    per-site mixes (e.g. long_mix) whose every site names a registered kernel."""
    files = {p.stem: OmegaConf.load(p) for p in (CONF_DIR / "attention").glob("*.yaml")}
    kernel_files = {name for name in files if name in available_kernels()}
    assert kernel_files == set(available_kernels())
    for name in kernel_files:
        assert files[name].kernel == name and "mechanism" not in files[name], name
    mixes = set(files) - kernel_files - set(RNN_ATTENTION)
    for name in mixes:
        site_kernels = [site.kernel for site in files[name].sites.values() if "kernel" in site]
        assert site_kernels and set(site_kernels) <= set(available_kernels()), name
    assert {files[name].mechanism for name in RNN_ATTENTION} == set(available_mechanisms())
    for name in RNN_ATTENTION:
        assert "decoder" in files[name] and "kernel" not in files[name], name


def test_model_rnn_alone_uses_bahdanau_attention(tmp_path: Path) -> None:
    cfg, model = build("model=rnn", *SMALL_RNN, tmp_path=tmp_path)
    assert cfg.hydra.runtime.choices["attention"] == "additive"
    assert isinstance(model, RNNSeq2Seq) and isinstance(model.decoder, BahdanauDecoder)
    assert isinstance(model.decoder.attention, AdditiveAttention)


def test_default_model_keeps_multi_head_attention(tmp_path: Path) -> None:
    cfg, model = build(*SMALL_MODEL, tmp_path=tmp_path)
    assert (cfg.hydra.runtime.choices["attention"], cfg.hydra.runtime.choices["heads"]) == ("eager", "mha")
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


@pytest.mark.parametrize("option", available_kernels())
def test_transformer_attention_on_the_rnn_stops_with_the_valid_choices(option: str, tmp_path: Path) -> None:
    with pytest.raises(
        AttentionConfigError,
        match=r"belongs to the transformer model family and does not fit model=rnn; valid mechanisms for "
        r"model=rnn: additive \| concat \| dot \| general",
    ):
        build("model=rnn", f"attention={option}", *SMALL_RNN, tmp_path=tmp_path)


@pytest.mark.parametrize("option", RNN_ATTENTION)
def test_rnn_attention_on_the_transformer_stops_with_the_valid_choices(option: str, tmp_path: Path) -> None:
    with pytest.raises(
        AttentionConfigError,
        match=r"belongs to the rnn model family and does not fit model=transformer; valid kernels for "
        r"model=transformer: eager \| flash \| flex \| linear \| linformer \| lsh \| sdpa \| sparse",
    ):
        build(f"attention={option}", *SMALL_MODEL, tmp_path=tmp_path)


@pytest.mark.parametrize("heads", ["gqa", "mqa"])
def test_a_head_layout_on_the_rnn_is_refused(heads: str, tmp_path: Path) -> None:
    with pytest.raises(
        AttentionConfigError, match=r"num_kv_heads=\d+ sets a Transformer head layout.*heads=mha"
    ):
        build("model=rnn", f"heads={heads}", *SMALL_RNN, tmp_path=tmp_path)


def test_rnn_experiment_is_a_bahdanau_lstm_of_about_five_million_parameters(tmp_path: Path) -> None:
    cfg, model = build("experiment=multi30k_rnn", tmp_path=tmp_path, vocab=8000)
    assert cfg.hydra.runtime.choices["model"] == "rnn"
    assert cfg.hydra.runtime.choices["attention"] == "additive"
    assert isinstance(model.encoder.rnn, torch.nn.LSTM)
    assert 4_000_000 < model.num_parameters() < 5_500_000
    cfg, model = build("experiment=multi30k_rnn", "attention=luong_general", tmp_path=tmp_path, vocab=8000)
    assert isinstance(model.decoder.attention, GeneralAttention)
