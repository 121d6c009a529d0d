"""``train.py`` in a process of its own: the command line that starts it, and waiting for its end.

Two callers train in a child process: a sweep's job (:mod:`app.training.sweep`: each job gets its own peak
memory, and a crash ends that job only) and ``make demo`` (:mod:`app.training.recipes`: measure first, then
train the chosen experiment). Both start ``train.py`` here as a plain single run in a given directory.
"""

from __future__ import annotations

import collections
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

TRAIN_SCRIPT = Path(__file__).resolve().parents[2] / "train.py"


@dataclass(frozen=True)
class ChildEnd:
    """How a child ``train.py`` ended."""

    returncode: int  # as subprocess gives it: 0 finished, N its exit code, -N killed by signal N
    error_tail: str = ""  # the last lines of its standard error, where they were kept
    interrupted: bool = False  # a Ctrl-C reached this process (and the child: same process group)

    @property
    def shell_status(self) -> int:
        """The exit status as a shell gives it: 128 + N when killed by signal N."""
        return self.returncode if self.returncode >= 0 else 128 - self.returncode

    def describe(self) -> str:
        """``exit code 1`` or ``killed by signal 9``, for failure records."""
        if self.returncode < 0:
            return f"killed by signal {-self.returncode}"
        return f"exit code {self.returncode}"


def single_run_command(overrides: list[str], run_dir: Path) -> list[str]:
    """``train.py`` as a single run with ``overrides``, writing into ``run_dir``."""
    quoted = str(run_dir).replace("\\", "\\\\").replace("'", "\\'")  # run dirs may hold '=' and ','
    return [sys.executable, str(TRAIN_SCRIPT), *overrides, f"hydra.run.dir='{quoted}'"]


def run_train_process(command: list[str], *, keep_error_lines: int = 0) -> ChildEnd:
    """Run ``command`` to its end; its output reaches this process's terminal as it comes.

    ``keep_error_lines`` > 0 reads the child's standard error line by line (passing each on) to keep its
    last lines, for a failure record; 0 leaves it untouched (a progress bar's carriage returns intact).
    A Ctrl-C reaches the child too: it is waited for, so it can stop cleanly, and the end says so.
    """
    tail: collections.deque[str] = collections.deque(maxlen=max(keep_error_lines, 1))
    stderr = subprocess.PIPE if keep_error_lines > 0 else None
    interrupted = False
    with subprocess.Popen(command, stderr=stderr, text=True, errors="replace") as child:
        try:
            for line in child.stderr or ():
                sys.stderr.write(line)
                tail.append(line)
            child.wait()
        except KeyboardInterrupt:
            interrupted = True
            _, rest = child.communicate()  # drains a piped stderr while the child stops
            sys.stderr.write(rest or "")
    return ChildEnd(child.returncode, "".join(tail) if keep_error_lines > 0 else "", interrupted)
