"""The Hydra callback that writes the ablation report when a sweep ends (conf/sweep/ablation.yaml)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from app.reports.report import write_report

log = logging.getLogger(__name__)


class AblationReport(Callback):
    """``on_multirun_end``: :func:`app.reports.report.write_report` on the sweep directory.

    ``decode_limit`` (test sentence pairs), ``beams`` and ``rounds`` bound the report's own decoding-speed
    measurement (:class:`app.reports.decode_speed.DecodeSettings`; null: its defaults).
    """

    def __init__(
        self,
        baseline: str | None = None,
        decode_limit: int | None = None,
        beams: Sequence[int] | None = None,
        rounds: int | None = None,
    ) -> None:
        self.baseline, self.decode_limit, self.rounds = baseline, decode_limit, rounds
        self.beams = tuple(int(beam) for beam in beams) if beams else None

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            paths = write_report(
                [sweep_dir],
                baseline=self.baseline,
                decode_limit=self.decode_limit,
                beams=self.beams,
                rounds=self.rounds,
            )
        except ValueError as err:  # no finished job: say so, the jobs' own errors were already raised
            log.error("no ablation report: %s", err)
            return
        for path in paths:
            log.info("wrote %s", path)
