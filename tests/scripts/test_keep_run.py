"""scripts/keep_run.py: a finished run (or a sweep) becomes a small record; checkpoints stay behind."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.training import REPO_ROOT

from app.reports.record import LOG_HEAD, LOG_TAIL, RecordError, keep_run, keep_sweep
from app.reports.runs import read_run


def fake_run(root: Path, log_lines: int = 10) -> Path:
    """The files a finished train.py run leaves, checkpoints included."""
    (root / ".hydra").mkdir(parents=True)
    (root / ".hydra" / "config.yaml").write_text("seed: 1\nmodel: {name: transformer}\n")
    (root / ".hydra" / "overrides.yaml").write_text("- seed=1\n")
    (root / "csv").mkdir()
    (root / "csv" / "metrics.csv").write_text("step,train/loss\n1,5.0\n2,4.0\n")
    (root / "results.json").write_text(json.dumps({"test_bleu": 12.5}))
    (root / "test.hyp").write_text("ein Hund .\nzwei Katzen .\n", encoding="utf-8")
    (root / "zeroshot.hyp").write_text("un chien .\n", encoding="utf-8")
    (root / "train.log").write_text("".join(f"line {i}\n" for i in range(log_lines)))
    (root / "checkpoints").mkdir()
    (root / "checkpoints" / "best.ckpt").write_bytes(b"weights")
    return root


def test_a_record_keeps_config_results_gzipped_metrics_and_translations(tmp_path: Path) -> None:
    run = fake_run(tmp_path / "run")
    written = keep_run(run, tmp_path / "docs" / "rec", extra=["zeroshot.hyp"])
    record = tmp_path / "docs" / "rec"
    assert sorted(map(str, written)) == sorted([
        ".hydra/config.yaml", ".hydra/overrides.yaml", "results.json", "csv/metrics.csv.gz",
        "test.hyp.gz", "zeroshot.hyp.gz", "train.log",
    ])  # fmt: skip
    assert not (record / "checkpoints").exists()
    assert gzip.decompress((record / "test.hyp.gz").read_bytes()) == (run / "test.hyp").read_bytes()
    assert (record / "train.log").read_text() == (run / "train.log").read_text()  # short: kept whole
    assert read_run(record).results == {"test_bleu": 12.5}  # the reports read a record as a run
    assert not [p for p in record.parent.iterdir() if p.name.startswith(".")]  # no temporary left


def test_a_long_log_keeps_its_ends_and_says_what_it_left_out(tmp_path: Path) -> None:
    keep_run(fake_run(tmp_path / "run", log_lines=500), tmp_path / "rec")
    lines = (tmp_path / "rec" / "train.log").read_text().splitlines()
    assert lines[:LOG_HEAD] == [f"line {i}" for i in range(LOG_HEAD)]
    assert lines[-LOG_TAIL:] == [f"line {i}" for i in range(500 - LOG_TAIL, 500)]
    assert (
        lines[LOG_HEAD]
        == f"[... {500 - LOG_HEAD - LOG_TAIL} of 500 lines left out, first 30 and last 50 kept]"
    )


def test_unfinished_runs_existing_records_and_missing_extras_are_refused(tmp_path: Path) -> None:
    run = fake_run(tmp_path / "run")
    (tmp_path / "rec").mkdir()
    with pytest.raises(RecordError, match="exists"):
        keep_run(run, tmp_path / "rec")
    with pytest.raises(RecordError, match=r"nothing\.hyp does not exist"):
        keep_run(run, tmp_path / "rec2", extra=["nothing.hyp"])
    assert not (tmp_path / "rec2").exists() and len(list(tmp_path.iterdir())) == 2  # nothing half-made
    (run / "results.json").unlink()
    with pytest.raises(RecordError, match="not a finished run"):
        keep_run(run, tmp_path / "rec3")


def test_the_script_reports_a_refusal_with_exit_2(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "scripts/keep_run.py", str(tmp_path / "none"), str(tmp_path / "rec")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "neither a finished run nor a sweep" in done.stderr


def fake_sweep(root: Path) -> Path:
    """A sweep directory: two finished jobs, one failed, the report with its caches, figures and html."""
    fake_run(root / "attention=eager,seed=1")
    fake_run(root / "attention=linear,seed=1")
    failed = root / "attention=lsh,seed=1"
    (failed / ".hydra").mkdir(parents=True)
    (failed / ".hydra" / "config.yaml").write_text("seed: 1\n")
    (failed / "FAILED").write_text("exit 137 (killed: out of memory?)\n")
    (failed / "train.log").write_text("epoch 0\n")
    for name in ("multirun.yaml", "report.md", "report.csv", "report.json", "decode_speed.json"):
        (root / name).write_text(name)
    (root / "group1_curves.png").write_bytes(b"png")
    (root / "report.html").write_text("<html>")  # rebuilt from the rest, never kept
    (root / "notes").mkdir()  # a directory that is no job
    return root


def test_a_sweep_record_keeps_every_job_failed_ones_too_and_the_reports_files(tmp_path: Path) -> None:
    sweep = fake_sweep(tmp_path / "sweep")
    written = keep_sweep(sweep, tmp_path / "docs" / "sweep")
    record = tmp_path / "docs" / "sweep"
    kept = {str(path) for path in written}
    assert kept == {str(p.relative_to(record)) for p in record.rglob("*") if p.is_file()}
    for job in ("attention=eager,seed=1", "attention=linear,seed=1"):
        assert {f"{job}/results.json", f"{job}/test.hyp.gz", f"{job}/csv/metrics.csv.gz"} <= kept
        assert read_run(record / job).status == "finished"
    assert read_run(record / "attention=lsh,seed=1").status == "failed"  # the report still names it
    assert {"report.md", "decode_speed.json", "group1_curves.png", "multirun.yaml"} <= kept
    assert not any("checkpoints" in path or path == "report.html" or "notes" in path for path in kept)
    with pytest.raises(RecordError, match="exists"):
        keep_sweep(sweep, record)
    with pytest.raises(RecordError, match="neither a finished run nor a sweep"):
        keep_sweep(sweep / "notes", tmp_path / "rec")


def test_the_script_records_a_sweep_directory(tmp_path: Path) -> None:
    sweep = fake_sweep(tmp_path / "sweep")
    done = subprocess.run(
        [sys.executable, "scripts/keep_run.py", str(sweep), str(tmp_path / "rec")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "rec" / "attention=lsh,seed=1" / "FAILED").is_file()
    assert str(tmp_path / "rec" / "report.md") in done.stdout.splitlines()
    refused = subprocess.run(
        [sys.executable, "scripts/keep_run.py", str(sweep), str(tmp_path / "rec2"), "--extra", "x.hyp"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2 and "--extra names more files of a run" in refused.stderr
