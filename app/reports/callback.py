"""The Hydra callback that writes the ablation report when a sweep ends (conf/experiment/ablation.yaml)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from app.reports.report import write_report

log = logging.getLogger(__name__)


class AblationReport(Callback):
    """``on_multirun_end``: :func:`app.reports.report.write_report` on the sweep directory."""

    def __init__(self, baseline: str | None = None, decode_limit: int | None = None) -> None:
        self.baseline, self.decode_limit = baseline, decode_limit

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            for path in write_report([sweep_dir], baseline=self.baseline, decode_limit=self.decode_limit):
                log.info("wrote %s", path)
        except ValueError as err:  # no finished job: say so, the jobs' own errors were already raised
            log.error("no ablation report: %s", err)
