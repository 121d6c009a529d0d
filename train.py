"""Train a translation model: ``python train.py experiment=quickstart`` (see conf/train.yaml).

In a sweep (``python train.py -m ...``) every job runs in a process of its own, and a failed job is
recorded in its directory instead of ending the sweep (:mod:`app.training.sweep`).
"""

import logging

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from app.training.distributed import register_resolvers
from app.training.sweep import run_job_in_own_process
from app.training.task import train

register_resolvers()  # before Hydra reads conf/train.yaml


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    logging.getLogger("app").setLevel(logging.INFO)
    if HydraConfig.get().mode == RunMode.MULTIRUN:
        run_job_in_own_process()
    else:
        train(cfg)


if __name__ == "__main__":
    main()
