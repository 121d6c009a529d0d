"""One job of a Hydra sweep (``python train.py -m ...``), run in a process of its own.

Hydra's launchers run a sweep's jobs in the sweeping process when they run one at a time (the joblib
launcher with ``n_jobs=1`` is sequential and in-process), so every job would share one peak-memory
figure and one crash would end the sweep. Here the job's process only starts ``train.py`` again as a
plain single run in the job's directory, with the job's overrides, and waits for it
(:mod:`app.training.train_process`, which ``make demo`` starts its training with too):

- the child's peak RSS is its own, so the report's memory column compares variants fairly;
- a child that fails (an exception, a kill, running out of memory) leaves ``<job dir>/FAILED`` with its
  exit code and the end of its error output; the sweep goes on and the report names the job;
- ``resume=true`` on the same sweep reruns only what is unfinished (``skip_finished``), from the
  job's ``last.ckpt``;
- when the sweep ends, ``train.py -m`` exits non-zero if any of its jobs failed, its last line naming
  them (:class:`FailedJobsExit`), so a script or a scheduler sees the failure.

What the job hands back to the sweeper is ``sweep_returns`` (:func:`sweep_job`): the child's exit code (the
ablation's sweeper ignores it), or for a tuning sweeper the objective, the trial's best validation score;
a tuning trial that failed raises :class:`JobFailed`, which Hydra keeps in the job's return, so the
Optuna sweeper records the trial as failed and goes on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from app.errors import ConfigError
from app.rundir import FAILED, RunDir
from app.training.train_process import ChildEnd, run_train_process, single_run_command

ERROR_LINES = 40  # lines of the child's standard error kept in FAILED
EXIT_CODE, VAL_BEST = "exit_code", "val_best"  # the choices of sweep_returns (conf/train.yaml)


class JobFailed(RuntimeError):
    """A tuning trial's job that gave no objective: its process failed, or it ran no validation."""


def sweep_job(cfg: DictConfig) -> int | float:
    """Run the current sweep job in a process of its own; return what ``cfg.sweep_returns`` names."""
    returncode = run_job_in_own_process()
    returns = cfg.get("sweep_returns", EXIT_CODE)
    if returns == EXIT_CODE:
        return returncode
    if returns != VAL_BEST:
        raise ConfigError(f"sweep_returns={returns!r}; valid choices: {EXIT_CODE}, {VAL_BEST}")
    return job_objective(Path(HydraConfig.get().runtime.output_dir), returncode)


def job_objective(job_dir: Path, returncode: int) -> float:
    """The best validation score the job's run wrote in results.json (``val_best``); :class:`JobFailed`
    where the run failed (its FAILED file says how) or validated never."""
    if returncode != 0:
        raise JobFailed(f"train.py {ChildEnd(returncode).describe()}: see {RunDir(job_dir).failed}")
    results = RunDir(job_dir).results
    value = json.loads(results.read_text()).get(VAL_BEST) if results.is_file() else None
    if value is None:
        raise JobFailed(
            f"no {VAL_BEST} in {results}: the run validated never "
            "(give trainer.val_check_interval at most trainer.max_steps)"
        )
    return float(value)


def run_job_in_own_process() -> int:
    """Run the current sweep job as a child process; returns its exit code (0: finished).

    A Ctrl-C stops the child and then the sweep (KeyboardInterrupt), with no FAILED written.
    """
    hydra_cfg = HydraConfig.get()
    job_dir = Path(hydra_cfg.runtime.output_dir)
    clear_failure(job_dir)
    command = single_run_command(list(hydra_cfg.overrides.task), job_dir)
    end = run_train_process(command, keep_error_lines=ERROR_LINES)
    if end.interrupted:
        raise KeyboardInterrupt
    if end.returncode != 0:
        record_child_failure(job_dir, end.returncode, end.error_tail)
    return end.returncode


def record_child_failure(job_dir: Path, returncode: int, error_tail: str) -> Path:
    """``<job dir>/FAILED``: how the job's process ended and the end of what it printed on stderr."""
    job_dir.mkdir(parents=True, exist_ok=True)
    path = RunDir(job_dir).failed
    path.write_text(f"train.py {ChildEnd(returncode).describe()}\n{error_tail}", encoding="utf-8")
    return path


def clear_failure(job_dir: Path) -> None:
    """Remove the FAILED file of an earlier attempt (a resumed sweep runs the job again)."""
    RunDir(job_dir).failed.unlink(missing_ok=True)


class FailedJobsExit(Callback):
    """Make ``train.py -m`` exit non-zero, naming its failed jobs, when any job of the sweep failed.

    A job's failure is its ``FAILED`` file (:func:`record_child_failure`), not the job's return value:
    a launcher may run jobs in other processes (joblib with ``n_jobs`` > 1), but their files reach the
    sweep directory either way. Files already there when the sweep started (a job of an earlier sweep in
    the same directory that this one does not run again) are left out.

    Hydra calls ``on_multirun_end`` in the reverse order of ``hydra.callbacks``, so this callback, first
    in ``conf/train.yaml``, runs after the others (the ablation report is written before the exit).
    """

    def __init__(self) -> None:
        self.before: dict[Path, int] = {}

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.before = failure_records(Path(config.hydra.sweep.dir))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        now = failure_records(sweep_dir)
        failed = [path for path, stamp in now.items() if self.before.get(path) != stamp]
        if failed:
            raise SystemExit(failed_jobs_line(sweep_dir, failed))


def failure_records(sweep_dir: Path) -> dict[Path, int]:
    """Every ``FAILED`` file under ``sweep_dir`` with its modification time (ns)."""
    if not sweep_dir.is_dir():
        return {}
    return {path: path.stat().st_mtime_ns for path in sorted(sweep_dir.rglob(FAILED))}


def failed_jobs_line(sweep_dir: Path, failed: list[Path]) -> str:
    """The sweep's last line of output: how many jobs failed and their directories under ``sweep_dir``."""
    names = ", ".join(path.parent.relative_to(sweep_dir).as_posix() for path in failed)
    jobs = "job" if len(failed) == 1 else "jobs"
    return f"train.py -m: {len(failed)} {jobs} failed (see FAILED in each) in {sweep_dir}: {names}"
