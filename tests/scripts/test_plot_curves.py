"""scripts/plot_curves.py: minutes from the logged metric or a wallclock.csv, and the PNG it writes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.inference.selection import SELECTION_METRICS
from app.reports.figures import BLEU_LABELS
from app.reports.runs import bleu_against_minutes, read_metrics

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "plot_curves.py"


def write_run(run_dir: Path, header: str, rows: list[str]) -> Path:
    (run_dir / "csv").mkdir(parents=True)
    (run_dir / "csv" / "metrics.csv").write_text("\n".join([header, *rows]) + "\n")
    return run_dir


def test_minutes_come_from_the_logged_metric(tmp_path: Path) -> None:
    run = write_run(
        tmp_path / "new",
        "step,train/nll,val/bleu,time/elapsed_min",
        ["10,5.0,,", "19,,12.0,2.5", "39,,20.0,5.0"],
    )
    assert bleu_against_minutes(run, read_metrics(run)) == ([2.5, 5.0], [12.0, 20.0])


def test_minutes_interpolated_from_a_wallclock_file(tmp_path: Path) -> None:
    run = write_run(tmp_path / "old", "step,val/bleu", ["100,10.0", "300,20.0"])
    # rows without a step are skipped; a middle epoch column is allowed
    (run / "wallclock.csv").write_text("1000,0\n1060,200\n1180,,\n1300,2,400\n1400,0\n")
    minutes, bleu = bleu_against_minutes(run, read_metrics(run))
    assert minutes == pytest.approx([0.5, 3.0])
    assert bleu == [10.0, 20.0]


def test_writes_the_png(tmp_path: Path) -> None:
    run = write_run(tmp_path / "r", "step,train/nll,val/bleu,time/elapsed_min", ["9,4.0,,", "19,3.0,7.0,1.0"])
    output = tmp_path / "fig" / "curves.png"
    subprocess.run([sys.executable, str(SCRIPT), str(run), "-o", str(output)], check=True)
    assert output.read_bytes().startswith(b"\x89PNG")


def test_lowercased_bleu_is_plotted_from_its_own_column(tmp_path: Path) -> None:
    run = write_run(
        tmp_path / "lc", "step,train/nll,val/bleu,val/bleu_lc,time/elapsed_min", ["19,3.0,7.0,30.0,1.0"]
    )
    assert set(BLEU_LABELS) == set(SELECTION_METRICS)  # every metric validation can choose on can be plotted
    assert bleu_against_minutes(run, read_metrics(run), "val/bleu_lc") == ([1.0], [30.0])
    output = tmp_path / "lc.png"
    subprocess.run(
        [sys.executable, str(SCRIPT), str(run), "--metric", "bleu_lc", "-o", str(output)], check=True
    )
    assert output.read_bytes().startswith(b"\x89PNG")
    bad = subprocess.run([sys.executable, str(SCRIPT), str(run), "--metric", "chrf", "-o", str(output)])
    assert bad.returncode == 2
