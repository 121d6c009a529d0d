"""Every Hydra config option composes and builds; bad choices and keys give errors that name them."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.configs import CONF_DIR, RNN_ATTENTION, SMALL_MODEL, SMALL_RNN, compose_config
from hydra.errors import MissingConfigException
from omegaconf import DictConfig, MissingMandatoryValue, OmegaConf

from app.attention import AttentionConfigError, MultiHeadAttention
from app.data.tokenizer import SubwordConfig
from app.inference.engine import SearchSettings
from app.models import build_model
from app.training.build import SCHEDULE_KEYS
from app.training.loggers import LOGGERS
from app.training.module import TranslationModule
from app.training.optim import configured_schedule
from app.training.task import check_trainer_options

pytestmark = pytest.mark.usefixtures("single_torch_thread")

GROUPS = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir())
OPTIONS = [(group, p.stem) for group in GROUPS for p in sorted((CONF_DIR / group).glob("*.yaml"))]


def test_every_group_has_options() -> None:
    assert {"data", "model", "attention", "trainer", "logger", "experiment"} <= set(GROUPS)
    assert {group for group, _ in OPTIONS} == set(GROUPS)


def check_composed(cfg: DictConfig) -> None:
    """What train() does with each part of the config, short of loading data and fitting."""
    config = OmegaConf.to_container(cfg, resolve=True)
    assert config["output_dir"]
    check_trainer_options(config["trainer"])
    SubwordConfig(**config["data"]["subword"])
    SearchSettings(**config["valid_search"])
    SearchSettings(**config["test_search"])
    optim_args = set(inspect.signature(TranslationModule.__init__).parameters) | set(SCHEDULE_KEYS)
    assert set(config["optim"]) <= optim_args, set(config["optim"]) - optim_args
    configured_schedule(config["optim"], config["trainer"].get("max_time"))  # what build_fit checks first
    assert config["logger"]["kind"] in LOGGERS

    torch.manual_seed(0)
    model = build_model(config["model"], config["attention"], src_vocab_size=50, tgt_vocab_size=50, pad_id=0)
    model.eval()
    src = torch.tensor([[5, 6, 7, 3], [8, 3, 0, 0]])
    tgt = torch.tensor([[2, 9, 10], [2, 11, 0]])
    with torch.no_grad():
        assert model(src, tgt).shape == (2, 3, 50)


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_and_builds(group: str, option: str, tmp_path: Path) -> None:
    overrides = [f"{group}={option}"]
    if group == "attention" and option in RNN_ATTENTION:
        overrides.append("model=rnn")  # RNN attention needs the rnn model (refusal: test_rnn_configs.py)
    family = compose_config(*overrides, tmp_path=tmp_path).model.family
    overrides += SMALL_RNN if family == "rnn" else SMALL_MODEL
    if option == "custom":  # the only data option with mandatory values
        overrides += [
            f"data.files.{split}.{side}=x.{side}"
            for split in ("train", "valid", "test")
            for side in ("src", "tgt")
        ]
    if option == "ablation_length_finetune":  # init_from resolves in a Hydra job: test_length_finetune.py
        overrides += ["from_sweep=x", "init_from=null"]
    if group == "arm" or option == "ablation_uptrain":  # the uptraining ablation's arms and its budgets
        overrides += [
            "experiment=ablation_uptrain",
            "uptrain.base=null",
            "uptrain.steps=3",
            "uptrain.total_steps=9",
            "uptrain.lr=1e-3",  # no base to read its last rate from (test_uptrain_config.py reads one)
        ]
    cfg = compose_config(*overrides, tmp_path=tmp_path)
    check_composed(cfg)


def test_custom_data_needs_its_files(tmp_path: Path) -> None:
    cfg = compose_config("data=custom", tmp_path=tmp_path)
    assert OmegaConf.is_missing(cfg.data.files.train, "src")
    with pytest.raises(MissingMandatoryValue, match=r"data\.files\.train\.src"):
        _ = cfg.data.files.train.src
    cfg = compose_config("data=custom", "data.files.train.src=a.de", tmp_path=tmp_path)
    assert cfg.data.files.train.src == "a.de"
    assert OmegaConf.is_missing(cfg.data.files.valid, "tgt")


def test_hub_data_reads_from_the_hub_not_files(tmp_path: Path) -> None:
    cfg = compose_config("data=hub", "data.src_lang=fr", tmp_path=tmp_path)
    assert cfg.data.files is None
    assert cfg.data.hub.src_column == "fr"
    assert cfg.data.hub.tgt_column == "en"


def test_multi30k_files_follow_the_languages(tmp_path: Path) -> None:
    cfg = compose_config("data.src_lang=en", "data.tgt_lang=fr", "data.suffix=.gz", tmp_path=tmp_path)
    assert cfg.data.files.train.src == "data/multi30k/train.en.gz"
    assert cfg.data.files.test.tgt == "data/multi30k/test_2016_flickr.fr.gz"


def leaves(node: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every leaf of a nested dict with its path of keys (a key may hold dots: hydra.sweeper.params)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from leaves(value, (*prefix, str(key)))
    else:
        yield prefix, node


def value_at(cfg: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        cfg = cfg.get(key) if cfg is not None else None
    return cfg


@pytest.mark.parametrize("experiment", [o for g, o in OPTIONS if g == "experiment"])
def test_experiment_settings_win(experiment: str, tmp_path: Path) -> None:
    spec = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "experiment" / f"{experiment}.yaml"))
    defaults = spec.pop("defaults", [])
    cfg = compose_config(f"experiment={experiment}", tmp_path=tmp_path, hydra_config=True)
    for path, value in leaves(spec):
        if isinstance(value, str) and "${" in value:  # an interpolation: resolved at run time (${now:...})
            continue
        if value == "???":  # mandatory: given on the command line (from_sweep=...)
            continue
        assert value_at(cfg, path) == value, ".".join(path)
    for entry in defaults:
        if isinstance(entry, str):  # another experiment this one extends (ablation: quickstart)
            continue
        for key, option in entry.items():
            group = key.removeprefix("override ").strip("/")
            assert cfg.hydra.runtime.choices[group] == option, key


def test_no_experiment_by_default(tmp_path: Path) -> None:
    cfg = compose_config(tmp_path=tmp_path, hydra_config=True)
    assert cfg.hydra.runtime.choices["experiment"] is None
    assert cfg.model.d_model == OmegaConf.load(CONF_DIR / "model" / "transformer.yaml").d_model


@pytest.mark.parametrize("group", GROUPS)
def test_unknown_option_names_the_valid_ones(group: str, tmp_path: Path) -> None:
    with pytest.raises(MissingConfigException, match=f"Could not find '{group}/no_such_option'") as err:
        compose_config(f"{group}=no_such_option", tmp_path=tmp_path)
    message = str(err.value)
    assert f"Available options in '{group}'" in message
    for g, option in OPTIONS:
        if g == group:
            assert option in message


def test_unknown_trainer_option_is_named() -> None:
    check_trainer_options({"max_epochs": 3, "accelerator": "cpu"})
    with pytest.raises(
        ValueError, match=r"unknown trainer option\(s\) \['max_epoch'\]; valid options: .*max_epochs"
    ):
        check_trainer_options({"max_epoch": 3, "accelerator": "cpu"})


def test_unknown_model_family_names_the_valid_choices() -> None:
    with pytest.raises(ValueError, match="unknown model family 'lstm'; valid choices: rnn, transformer"):
        build_model({"family": "lstm"}, {}, src_vocab_size=10, tgt_vocab_size=10, pad_id=0)
    with pytest.raises(ValueError, match="unknown model family None"):
        build_model({"d_model": 32}, {}, src_vocab_size=10, tgt_vocab_size=10, pad_id=0)


def test_unknown_model_setting_is_named() -> None:
    with pytest.raises(ValueError, match=r"bad setting for model family 'transformer'.*d_modle"):
        build_model(
            {"family": "transformer", "d_modle": 32}, {}, src_vocab_size=10, tgt_vocab_size=10, pad_id=0
        )


@pytest.mark.parametrize("option", ["eager", "sdpa"])
def test_bad_attention_config_fails_at_build_time(option: str, tmp_path: Path) -> None:
    cfg = compose_config(*SMALL_MODEL, f"attention={option}", "heads.num_kv_heads=3", tmp_path=tmp_path)
    config = OmegaConf.to_container(cfg, resolve=True)
    with pytest.raises(AttentionConfigError, match=r"num_kv_heads=3 must divide num_heads=4 \(1 = MQA"):
        build_model(config["model"], config["attention"], src_vocab_size=50, tgt_vocab_size=50, pad_id=0)


@pytest.mark.parametrize(
    ("overrides", "kv_heads"),
    [
        (["attention=sdpa", "heads.num_kv_heads=2"], 2),
        (["attention=sdpa", "heads=gqa"], 2),
        (["attention=sdpa", "heads=mqa"], 1),
        (["attention=sdpa", "heads=gqa", "attention.num_kv_heads=1"], 1),  # what checkpoints store wins
    ],
    ids=["kv2", "gqa", "mqa", "attention_key"],
)
def test_head_layout_configs_set_the_kv_heads_of_every_site(
    overrides: list[str], kv_heads: int, tmp_path: Path
) -> None:
    cfg = compose_config(*SMALL_MODEL, *overrides, tmp_path=tmp_path, hydra_config=True)
    assert cfg.hydra.runtime.choices["attention"] == "sdpa"
    attention_cfg = OmegaConf.to_container(cfg.attention, resolve=True)
    assert (attention_cfg["kernel"], attention_cfg["num_kv_heads"]) == ("sdpa", kv_heads)
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    model = build_model(model_cfg, attention_cfg, src_vocab_size=50, tgt_vocab_size=50, pad_id=0)
    layers = [*model.encoder, *model.decoder]
    attentions = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    assert len(attentions) == len(layers) + len(model.decoder)  # encoder self, decoder self and cross
    head_dim = cfg.model.d_model // cfg.model.num_heads
    for attention in attentions:
        assert attention.num_kv_heads == kv_heads
        assert attention.k_proj.out_features == attention.v_proj.out_features == kv_heads * head_dim
