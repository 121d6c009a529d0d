"""Composing the Hydra train config in-process, and overrides that shrink whatever model it asks for."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
# The attention options of the rnn family: those that pick a mechanism rather than a kernel.
RNN_ATTENTION = sorted(
    p.stem for p in (CONF_DIR / "attention").glob("*.yaml") if "mechanism" in OmegaConf.load(p)
)
# Shrinks whatever model a config asks for, so building it takes milliseconds.
SMALL_MODEL = [
    "model.d_model=32",
    "model.num_heads=4",
    "model.d_ff=64",
    "model.encoder_layers=1",
    "model.decoder_layers=1",
]
SMALL_RNN = [
    "model.embedding_size=16",
    "model.encoder_hidden_size=8",
    "model.decoder_hidden_size=16",
    "model.encoder_layers=1",
    "model.decoder_layers=1",
]


@contextmanager
def hydra_conf() -> Iterator[None]:
    """Hydra's global state initialised on conf/ for the duration of the block."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        yield


def compose_config(*overrides: str, tmp_path: Path, hydra_config: bool = False) -> DictConfig:
    """The train config with ``overrides``, its ``output_dir`` under ``tmp_path``.

    ``output_dir`` interpolates ``${hydra:runtime.output_dir}``, which only a real Hydra run can resolve.
    """
    with hydra_conf():
        return compose(
            "train", overrides=[f"output_dir={tmp_path}", *overrides], return_hydra_config=hydra_config
        )
