"""Experiment loggers from the ``logger`` config group: CSV (default) or Weights & Biases."""

from __future__ import annotations

import logging
import netrc
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pytorch_lightning.loggers import CSVLogger, Logger, WandbLogger

from app.errors import ConfigError

log = logging.getLogger(__name__)


def _csv(cfg: Mapping[str, Any], run_dir: Path) -> Logger:
    return CSVLogger(save_dir=run_dir, name="csv", version="")


WANDB_DEFAULT_HOST = "https://api.wandb.ai"


def wandb_mode() -> str:
    """'offline' unless asked otherwise or logged in, so a run never waits on a login prompt."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if wandb_api_key_present():
        return "online"
    log.warning("wandb: not logged in, logging offline (sync later with `wandb sync`)")
    return "offline"


def wandb_api_key_present() -> bool:
    """True when ``WANDB_API_KEY`` is set or the netrc file holds a password for the W&B host.

    ``wandb login`` stores the key in netrc (``$NETRC`` or ``~/.netrc``) under the host of
    ``WANDB_BASE_URL``; reading it with the standard library neither contacts the server nor prompts.
    """
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL") or WANDB_DEFAULT_HOST).hostname
    path = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    if not host or not path.is_file():
        return False
    try:
        entry = netrc.netrc(path).authenticators(host)
    except (OSError, netrc.NetrcParseError) as err:
        log.warning("wandb: cannot read %s (%s)", path, err)
        return False
    return bool(entry and entry[2])


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
        raise ConfigError(f"unknown logger {name!r}; valid choices: {', '.join(sorted(LOGGERS))}")
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
