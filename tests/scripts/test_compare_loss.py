"""scripts/compare_loss.py: a paired test of two runs' training-loss curves (app/reports/loss_match.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from app.reports.loss_match import compare_losses

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "compare_loss.py"


def write_run(run_dir: Path, losses: dict[int, float]) -> Path:
    """A run directory whose csv/metrics.csv logged ``losses`` by step (and a validation row between)."""
    (run_dir / "csv").mkdir(parents=True)
    rows = ["epoch,step,train/loss,val/bleu"]
    rows += [f"0,{step},{loss}," for step, loss in losses.items()]
    rows.append("0,250,,12.5")  # a row without a training loss is skipped
    (run_dir / "csv" / "metrics.csv").write_text("\n".join(rows) + "\n")
    return run_dir


def curves(shift: float, tmp_path: Path) -> tuple[Path, Path]:
    """Run A: a decaying loss logged every 20 steps; B: the same plus noise (and ``shift``)."""
    rng = np.random.default_rng(0)
    steps = range(19, 600, 20)
    base = {s: 8.0 * np.exp(-s / 300) + 2.0 for s in steps}
    noisy = {s: loss + shift + rng.normal(0, 0.01) for s, loss in base.items()}
    return write_run(tmp_path / "a", base), write_run(tmp_path / "b", noisy)


def test_noise_alone_is_not_significant_and_a_shift_is(tmp_path: Path) -> None:
    same = compare_losses(*curves(0.0, tmp_path / "same"), until=500, window=100)
    shifted = compare_losses(*curves(0.02, tmp_path / "shifted"), until=500, window=100)
    assert same.total.steps == 25 and [w.first for w in same.windows] == [19, 119, 219, 319, 419]
    assert same.p_value > 0.05 and same.interval[0] < 0 < same.interval[1]
    assert shifted.p_value < 0.01 and shifted.interval[0] > 0.01
    assert shifted.total.difference == pytest.approx(0.02, abs=0.005)


def test_the_script_prints_the_table_and_exits_1_on_a_significant_difference(tmp_path: Path) -> None:
    for shift, status in ((0.0, 0), (0.02, 1)):
        run_a, run_b = curves(shift, tmp_path / str(shift))
        done = subprocess.run(
            [sys.executable, str(SCRIPT), str(run_a), str(run_b), "--until", "500"],
            capture_output=True,
            text=True,
        )
        assert done.returncode == status, done.stderr
        assert "| all 19-499 | 25 |" in done.stdout and "sign-flip p =" in done.stdout


def test_runs_without_common_steps_name_both_directories(tmp_path: Path) -> None:
    run_a = write_run(tmp_path / "a", {19: 5.0, 39: 4.0})
    run_b = write_run(tmp_path / "b", {20: 5.0, 40: 4.0})
    with pytest.raises(ValueError, match=r"a and .*b logged train/loss at 0 common step"):
        compare_losses(run_a, run_b, until=500, window=100)
