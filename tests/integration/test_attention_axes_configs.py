"""Hydra composes the two attention axes freely: ``attention=<kernel> heads=<layout>`` for every pair, and
the configs of earlier runs (num_kv_heads inside ``attention``, no heads group) still build."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.configs import CONF_DIR, RNN_ATTENTION, SMALL_MODEL, SMALL_RNN, compose_config
from omegaconf import OmegaConf

from app.attention import MultiHeadAttention, available_kernels
from app.attention.config import describe_attention
from app.models import build_model

pytestmark = pytest.mark.usefixtures("single_torch_thread")

HEADS = sorted(p.stem for p in (CONF_DIR / "heads").glob("*.yaml"))
PAIRS = [(kernel, heads) for kernel in available_kernels() for heads in HEADS]
RUN_CONFIGS = sorted((Path(__file__).resolve().parents[2] / "docs" / "results").glob("**/.hydra/config.yaml"))


def test_the_heads_group_offers_the_three_layouts() -> None:
    assert HEADS == ["gqa", "mha", "mqa"]


@pytest.mark.parametrize(("kernel", "heads"), PAIRS, ids=[f"{k}-{h}" for k, h in PAIRS])
def test_every_kernel_composes_with_every_head_layout(kernel: str, heads: str, tmp_path: Path) -> None:
    cfg = compose_config(*SMALL_MODEL, f"attention={kernel}", f"heads={heads}", tmp_path=tmp_path)
    attention = OmegaConf.to_container(cfg.attention, resolve=True)
    expected_kv = OmegaConf.load(CONF_DIR / "heads" / f"{heads}.yaml").num_kv_heads
    assert (attention["kernel"], attention["num_kv_heads"]) == (kernel, expected_kv)
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    model = build_model(model_cfg, attention, src_vocab_size=50, tgt_vocab_size=50, pad_id=0)
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    assert {m.num_kv_heads for m in layers} == {expected_kv or cfg.model.num_heads}
    assert {type(m.kernel).name for m in layers} >= {kernel}


def test_a_group_count_can_be_set_without_choosing_a_layout(tmp_path: Path) -> None:
    cfg = compose_config(*SMALL_MODEL, "attention=sdpa", "heads.num_kv_heads=2", tmp_path=tmp_path)
    attention = OmegaConf.to_container(cfg.attention, resolve=True)
    assert describe_attention(attention) == "sdpa kv=2"


@pytest.mark.parametrize("option", RNN_ATTENTION)
def test_rnn_attention_composes_with_the_default_layout(option: str, tmp_path: Path) -> None:
    cfg = compose_config("model=rnn", f"attention={option}", *SMALL_RNN, tmp_path=tmp_path)
    attention = OmegaConf.to_container(cfg.attention, resolve=True)
    assert attention["num_kv_heads"] is None
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    build_model(model_cfg, attention, src_vocab_size=50, tgt_vocab_size=50, pad_id=0)


@pytest.mark.parametrize("path", RUN_CONFIGS, ids=[str(p.parents[1].name) for p in RUN_CONFIGS])
def test_configs_of_earlier_runs_still_build(path: Path) -> None:
    """What checkpoints of those runs store: ``config["attention"]`` with num_kv_heads inside it."""
    config = OmegaConf.load(path)
    attention = OmegaConf.to_container(config.attention, resolve=True)
    model_cfg = OmegaConf.to_container(config.model, resolve=True)
    small = SMALL_RNN if model_cfg["family"] == "rnn" else SMALL_MODEL
    model_cfg |= {key.removeprefix("model.").split("=")[0]: int(key.split("=")[1]) for key in small}
    if model_cfg["family"] == "rnn" and attention["mechanism"] == "dot":
        model_cfg["decoder_hidden_size"] = 2 * model_cfg["encoder_hidden_size"]
    model = build_model(model_cfg, attention, src_vocab_size=50, tgt_vocab_size=50, pad_id=0)
    assert model.num_parameters() > 0
    assert describe_attention(attention).split()[0] in {*available_kernels(), "bahdanau", "luong"}
