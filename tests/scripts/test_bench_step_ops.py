"""scripts/bench_step_ops.py (app.bench.step_ops): its four tables, one row per row count, at tiny sizes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.bench import step_ops

pytestmark = pytest.mark.usefixtures("single_torch_thread")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_step_ops.py"


def test_script_prints_its_tables_with_a_row_per_count() -> None:
    """Linears, attention and oneDNN at every row count; candidates at the counts the beam (3) divides."""
    args = [
        "--d-model",
        "32",
        "--d-ff",
        "64",
        "--layers",
        "1",
        "--vocab",
        "640",
        "--keys",
        "5",
        "--beam",
        "3",
    ]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--rows", "1", "3", "--repeats", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("CPU: ")
    linear = [line for line in lines if line.startswith("| ") and line.endswith("x |") and "ms" not in line]
    assert [line.split(" | ")[0] for line in linear] == ["| 1", "| 3", "| 1", "| 3", "| 1", "| 3", "| 3"]
    assert any("chunks of 160" in line for line in lines)


def test_candidate_timing_checks_both_rankings_agree() -> None:
    plain, chunked = step_ops.candidates_ms(rows=10, beam=5, vocab=1024, repeats=2)
    assert plain > 0 and chunked > 0


def test_step_weights_are_a_steps_linears_in_call_order() -> None:
    weights = step_ops.step_weights(d_model=8, d_ff=16, layers=2, vocab=11)
    assert [tuple(w.shape) for w, _ in weights] == [
        *([(8, 8)] * 6 + [(16, 8), (8, 16)]) * 2,
        (11, 8),
    ]
    assert all(b.shape == w.shape[:1] for w, b in weights)
