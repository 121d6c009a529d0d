"""The repository stays slim: no checkpoints and no file over 2 MB is ever tracked.

Run outputs belong in ignored directories (``runs/``, ``outputs/``, ``multirun/``); what a reader needs
of a run (config, metrics, results, a short log) is copied to ``docs/results/<run>/``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
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
