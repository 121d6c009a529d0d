"""One job of a Hydra sweep (``python train.py -m ...``), run in a process of its own.

Hydra's launchers run a sweep's jobs in the sweeping process when they run one at a time (the joblib
launcher with ``n_jobs=1`` is sequential and in-process), so every job would share one peak-memory
figure and one crash would end the sweep. Here the job's process only starts ``train.py`` again as a
plain single run in the job's directory, with the job's overrides, and waits for it:

- the child's peak RSS is its own, so the report's memory column compares variants fairly;
- a child that fails (an exception, a kill, running out of memory) leaves ``<job dir>/FAILED`` with its
  exit code and the end of its error output; the sweep goes on and the report names the job;
- ``resume=true`` on the same sweep reruns only what is unfinished (``skip_finished``), from the
  job's ``last.ckpt``.
"""

from __future__ import annotations

import collections
import subprocess
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig

from app.rundir import RunDir

TRAIN_SCRIPT = Path(__file__).resolve().parents[2] / "train.py"
ERROR_LINES = 40  # lines of the child's standard error kept in FAILED


def child_command(overrides: list[str], job_dir: Path) -> list[str]:
    """``train.py`` as a single run with the job's overrides, writing into the job's directory."""
    quoted = str(job_dir).replace("\\", "\\\\").replace("'", "\\'")  # job dirs hold '=' and ','
    return [sys.executable, str(TRAIN_SCRIPT), *overrides, f"hydra.run.dir='{quoted}'"]


def run_job_in_own_process() -> int:
    """Run the current sweep job as a child process; returns its exit code (0: finished)."""
    hydra_cfg = HydraConfig.get()
    job_dir = Path(hydra_cfg.runtime.output_dir)
    clear_failure(job_dir)
    command = child_command(list(hydra_cfg.overrides.task), job_dir)
    tail: collections.deque[str] = collections.deque(maxlen=ERROR_LINES)
    with subprocess.Popen(command, stderr=subprocess.PIPE, text=True, errors="replace") as child:
        assert child.stderr is not None
        for line in child.stderr:  # pass the child's progress on, keep its last lines
            sys.stderr.write(line)
            tail.append(line)
    if child.returncode != 0:
        record_child_failure(job_dir, child.returncode, "".join(tail))
    return child.returncode


def record_child_failure(job_dir: Path, returncode: int, error_tail: str) -> Path:
    """``<job dir>/FAILED``: how the job's process ended and the end of what it printed on stderr."""
    job_dir.mkdir(parents=True, exist_ok=True)
    how = f"killed by signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
    path = RunDir(job_dir).failed
    path.write_text(f"train.py {how}\n{error_tail}", encoding="utf-8")
    return path


def clear_failure(job_dir: Path) -> None:
    """Remove the FAILED file of an earlier attempt (a resumed sweep runs the job again)."""
    RunDir(job_dir).failed.unlink(missing_ok=True)
