"""Experiment loggers from the ``logger`` config group: CSV (default) or Weights & Biases."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pytorch_lightning.loggers import CSVLogger, Logger, WandbLogger

log = logging.getLogger(__name__)


def _csv(cfg: Mapping[str, Any], run_dir: Path) -> Logger:
    return CSVLogger(save_dir=run_dir, name="csv", version="")


def wandb_mode() -> str:
    """'offline' unless asked otherwise or logged in, so a run never waits on a login prompt."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    import wandb

    if os.environ.get("WANDB_API_KEY") or wandb.api.api_key:
        return "online"
    log.warning("wandb: not logged in, logging offline (sync later with `wandb sync`)")
    return "offline"


def _wandb(cfg: Mapping[str, Any], run_dir: Path) -> Logger:
    mode = wandb_mode()
    os.environ.setdefault("WANDB_SILENT", "true")
    return WandbLogger(
        project=cfg.get("project", "attn-mt"),
        name=cfg.get("run_name"),
        save_dir=str(run_dir),
        offline=mode == "offline",
        mode=mode,
        tags=list(cfg.get("tags") or []),
    )


LOGGERS: dict[str, Callable[[Mapping[str, Any], Path], Logger]] = {"csv": _csv, "wandb": _wandb}


def build_logger(cfg: Mapping[str, Any], run_dir: Path) -> Logger | bool:
    """The logger named by ``cfg.kind`` (``null`` disables logging)."""
    name = cfg.get("kind") if cfg else None
    if name is None:
        return False
    if name not in LOGGERS:
        raise ValueError(f"unknown logger {name!r}; valid choices: {', '.join(sorted(LOGGERS))}")
    return LOGGERS[name](cfg, run_dir)


def log_results_and_close(logger: Logger | bool, results: dict[str, Any]) -> None:
    """Record the final test scores with the run's logger, then close it (uploads or seals wandb files)."""
    if not isinstance(logger, Logger):
        return
    logger.log_metrics({f"test/{k.removeprefix('test_')}": v for k, v in results.items() if _is_number(v)})
    logger.finalize("success")
    if isinstance(logger, WandbLogger):
        logger.experiment.finish()


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
