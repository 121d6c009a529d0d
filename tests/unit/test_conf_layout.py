"""The config tree stays shallow: model sizes are ``model`` options, and experiments extend one level only.

An experiment may start from one other experiment (``defaults: [multi30k_best_de_en, ...]``), but that one
starts from none, so what an experiment sets is read in at most two files.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


def parents(experiment: str) -> list[str]:
    """The experiments that ``experiment`` extends: plain strings in its defaults list."""
    spec = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "experiment" / f"{experiment}.yaml"))
    return [entry for entry in spec.get("defaults", []) if isinstance(entry, str) and entry != "_self_"]


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiments_extend_one_level_only(experiment: str) -> None:
    for parent in parents(experiment):
        assert parent in EXPERIMENTS, f"{experiment} extends {parent}, which is no experiment"
        assert not parents(parent), f"{experiment} -> {parent} -> {parents(parent)}: more than one level"


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiments_choose_a_model_size_instead_of_spelling_it(experiment: str) -> None:
    """Width and depth come from a ``model`` option (transformer_tiny, transformer_small, ...)."""
    spec = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "experiment" / f"{experiment}.yaml"))
    sizes = {"d_model", "num_heads", "encoder_layers", "decoder_layers", "d_ff"}
    assert not sizes & set(spec.get("model") or {}), f"{experiment} sets {sizes & set(spec['model'])}"


def test_every_transformer_size_extends_the_base_model() -> None:
    sizes = sorted(p.stem for p in (CONF_DIR / "model").glob("transformer_*.yaml"))
    assert {"transformer_small", "transformer_tiny"} <= set(sizes)
    for size in sizes:
        spec = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / f"{size}.yaml"))
        assert spec["defaults"] == ["transformer", "_self_"], size
