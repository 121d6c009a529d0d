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
  job's ``last.ckpt``.
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.hydra_config import HydraConfig

from app.rundir import RunDir
from app.training.train_process import ChildEnd, run_train_process, single_run_command

ERROR_LINES = 40  # lines of the child's standard error kept in FAILED


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
