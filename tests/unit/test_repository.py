"""The repository stays slim: no checkpoints and no file over 2 MB is ever tracked.

Run outputs belong in ignored directories (``runs/``, ``outputs/``, ``multirun/``); what a reader needs
of a run (config, metrics, results, a short log) is copied to ``docs/results/<run>/``.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from helpers.training import REPO_ROOT

MAX_BYTES = 2 * 1024 * 1024


def tracked_files() -> list[Path]:
    """Every file git tracks (the working tree as committed or staged)."""
    listing = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True
    ).stdout.decode()
    return [REPO_ROOT / name for name in listing.split("\0") if name]


def test_the_repository_is_a_git_checkout() -> None:
    assert tracked_files(), f"git ls-files found nothing under {REPO_ROOT}"


def test_no_checkpoint_is_tracked() -> None:
    checkpoints = [str(p.relative_to(REPO_ROOT)) for p in tracked_files() if p.suffix in {".ckpt", ".pt"}]
    assert not checkpoints, f"checkpoints must not be committed: {checkpoints}"


def test_no_tracked_file_exceeds_2_mb() -> None:
    large = {
        str(p.relative_to(REPO_ROOT)): p.stat().st_size
        for p in tracked_files()
        if p.is_file() and not p.is_symlink() and p.stat().st_size > MAX_BYTES
    }
    assert not large, f"files over {MAX_BYTES} bytes are tracked: {large}"


def test_make_demo_writes_only_to_an_ignored_directory() -> None:
    """``make demo`` must not rewrite tracked files: its run directory is git-ignored."""
    makefile = (REPO_ROOT / "Makefile").read_text()
    run_dir = re.search(r"^RUN_DIR \?= (\S+)$", makefile, re.MULTILINE)
    assert run_dir, "the Makefile sets no default RUN_DIR"
    probe = f"{run_dir.group(1)}/results.json"
    ignored = subprocess.run(["git", "check-ignore", "-q", probe], cwd=REPO_ROOT, check=False)
    assert ignored.returncode == 0, f"make demo writes {probe}, which git does not ignore"
