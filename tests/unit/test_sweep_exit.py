"""app.training.sweep.FailedJobsExit: which FAILED files make ``train.py -m`` exit non-zero (this sweep's,
not an earlier sweep's in the same directory), its last line, and its place among the sweep's callbacks.
The sweep itself runs for real in tests/scripts/test_ablation_sweep.py (a failed job: exit 1, its
last line naming it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers.configs import compose_config
from omegaconf import OmegaConf

from app.training.sweep import FailedJobsExit, clear_failure, record_child_failure


def test_only_failures_written_during_the_sweep_count(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}})
    stale = record_child_failure(sweep / "seed=1", 1, "an earlier sweep's job, not run again\n")
    again = record_child_failure(sweep / "seed=2", 1, "an earlier failure of a job run again\n")
    callback = FailedJobsExit()
    callback.on_multirun_start(config)

    callback.on_multirun_end(config)  # nothing failed during this sweep: no exit
    clear_failure(sweep / "seed=2")  # what run_job_in_own_process does first
    record_child_failure(sweep / "seed=2", 1, "it failed again\n")
    os.utime(again, ns=(0, 0))  # the rewrite is told apart by its time, whatever the clock's resolution
    record_child_failure(sweep / "seed=3", -9, "")
    with pytest.raises(SystemExit) as ended:
        callback.on_multirun_end(config)
    assert str(ended.value) == f"train.py -m: 2 jobs failed (see FAILED in each) in {sweep}: seed=2, seed=3"
    assert stale.is_file()


def test_the_exit_comes_after_the_ablation_report(tmp_path: Path) -> None:
    """Hydra ends a sweep's callbacks last-first: the exit must be first, so the report is still written."""
    cfg = compose_config("experiment=ablation", tmp_path=tmp_path, hydra_config=True)
    assert list(cfg.hydra.callbacks) == ["failed_jobs", "ablation_report"]
    assert cfg.hydra.callbacks.failed_jobs._target_ == "app.training.sweep.FailedJobsExit"
