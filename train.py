"""Train a translation model: ``python train.py experiment=quickstart`` (see conf/train.yaml)."""

import logging

import hydra
from omegaconf import DictConfig

from app.distributed import register_resolvers
from app.training import train

register_resolvers()  # before Hydra reads conf/train.yaml


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    logging.getLogger("app").setLevel(logging.INFO)
    train(cfg)


if __name__ == "__main__":
    main()
