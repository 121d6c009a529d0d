"""app.training.train_process: the one way a sweep job and ``make demo`` start ``train.py`` as a child,
its command line and what is known when the child ends (exit code, signal, last error lines)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from app.training.train_process import TRAIN_SCRIPT, ChildEnd, run_train_process, single_run_command


def test_the_command_is_a_single_run_writing_into_the_given_directory(tmp_path: Path) -> None:
    run_dir = tmp_path / "attention=eager,seed=1"  # a sweep job's directory: '=' and ',' in its name
    command = single_run_command(["seed=1"], run_dir)
    assert command[:2] == [sys.executable, str(TRAIN_SCRIPT)] and TRAIN_SCRIPT.is_file()
    assert command[2:] == ["seed=1", f"hydra.run.dir='{run_dir}'"]


def test_the_last_error_lines_are_kept_and_passed_on(capfd: pytest.CaptureFixture[str]) -> None:
    script = "import sys\nfor i in range(5): print(f'line {i}', file=sys.stderr)\nsys.exit(2)"
    end = run_train_process([sys.executable, "-c", script], keep_error_lines=2)
    assert end == ChildEnd(returncode=2, error_tail="line 3\nline 4\n")
    assert end.describe() == "exit code 2" and end.shell_status == 2
    assert "line 0" in capfd.readouterr().err  # every line still reached the terminal


def test_a_child_killed_by_a_signal_says_which() -> None:
    end = run_train_process([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    assert end.returncode == -9 and end.describe() == "killed by signal 9" and end.shell_status == 137
    assert end.error_tail == ""  # not asked to keep any
