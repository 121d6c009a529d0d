"""scripts/keep_run.py: a finished run (or a sweep) becomes a small compact record; checkpoints stay
behind; an older record (a directory of files per job) is packed in place and reads the same."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.training import REPO_ROOT

from app.reports.layout import HYPOTHESES_PACKED, RUNS, dir_parts, stored_run
from app.reports.record import LOG_HEAD, LOG_TAIL, RecordError, compact_record, keep_run, keep_sweep
from app.reports.runs import RunRecord, read_run, read_runs


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


def test_a_record_packs_every_part_in_its_compact_files(tmp_path: Path) -> None:
    run = fake_run(tmp_path / "run")
    written = keep_run(run, tmp_path / "docs" / "rec", extra=["zeroshot.hyp"])
    record = tmp_path / "docs" / "rec"
    assert sorted(map(str, written)) == sorted([HYPOTHESES_PACKED, RUNS, "zeroshot.hyp.gz"])
    assert sorted(p.name for p in record.iterdir()) == sorted(map(str, written))  # no checkpoints
    assert gzip.decompress((record / "zeroshot.hyp.gz").read_bytes()) == (run / "zeroshot.hyp").read_bytes()
    assert stored_run(record).parts == dir_parts(run)  # every part as the run wrote it (a short log: whole)
    kept = read_run(record)  # the reports read a record as a run
    assert kept.results == {"test_bleu": 12.5} and kept.hypotheses == ["ein Hund .", "zwei Katzen ."]
    assert kept.metrics == [{"step": 1.0, "train/loss": 5.0}, {"step": 2.0, "train/loss": 4.0}]
    assert not [p for p in record.parent.iterdir() if p.name.startswith(".")]  # no temporary left


def test_a_long_log_keeps_its_ends_and_says_what_it_left_out(tmp_path: Path) -> None:
    keep_run(fake_run(tmp_path / "run", log_lines=500), tmp_path / "rec")
    lines = stored_run(tmp_path / "rec").parts.log.splitlines()
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
    assert {RUNS, HYPOTHESES_PACKED, "report.md", "decode_speed.json", "group1_curves.png"} <= kept
    assert "multirun.yaml" in kept and len(kept) == 8  # the two packed files, the sweep's six
    for job in ("attention=eager,seed=1", "attention=linear,seed=1"):
        assert read_run(record / job).status == "finished"
        assert read_run(record / job).hypotheses == ["ein Hund .", "zwei Katzen ."]
    failed = read_run(record / "attention=lsh,seed=1")  # the report still names it
    assert failed.status == "failed" and failed.error == "exit 137 (killed: out of memory?)\n"
    assert failed.hypotheses is None
    assert [run.name for run in read_runs(record)] == [p.name for p in sorted(sweep.iterdir())][:3]
    with pytest.raises(RecordError, match="exists"):
        keep_sweep(sweep, record)
    with pytest.raises(RecordError, match="neither a finished run nor a sweep"):
        keep_sweep(sweep / "notes", tmp_path / "rec")


def comparable(run: RunRecord) -> tuple[object, ...]:
    """What the reports read of a run, its translations included."""
    return run.path, run.config, run.metrics, run.results, run.log_tail, run.error, run.hypotheses


def test_compacting_an_older_record_in_place_reads_the_same_and_removes_the_job_files(
    tmp_path: Path,
) -> None:
    record = fake_sweep(tmp_path / "record")  # the layout records had before: a directory per job
    (record / "notes" / "keep.txt").write_text("not a job")
    before = [comparable(run) for run in read_runs(record)]
    assert sorted(map(str, compact_record(record))) == [HYPOTHESES_PACKED, RUNS]
    assert [comparable(run) for run in read_runs(record)] == before
    assert not (record / "attention=lsh,seed=1").exists()  # every file packed: the directory goes
    left = sorted(p.name for p in (record / "attention=eager,seed=1").iterdir())
    assert left == ["checkpoints", "zeroshot.hyp"]  # what a record does not hold stays
    assert (record / "notes" / "keep.txt").is_file() and (record / "report.md").read_text() == "report.md"
    with pytest.raises(RecordError, match="compact already"):
        compact_record(record)
    with pytest.raises(RecordError, match="holds no run directory"):
        compact_record(record / "notes")


def test_compacting_a_one_run_record_keeps_its_extras(tmp_path: Path) -> None:
    run = fake_run(tmp_path / "run")
    before = comparable(read_run(run))
    compact_record(run)
    assert sorted(p.name for p in run.iterdir()) == sorted(
        ["checkpoints", "zeroshot.hyp", RUNS, HYPOTHESES_PACKED]
    )
    assert comparable(read_run(run)) == before


def test_the_script_compacts_records_in_place(tmp_path: Path) -> None:
    record = fake_sweep(tmp_path / "record")
    done = subprocess.run(
        [sys.executable, "scripts/keep_run.py", "--compact", str(record)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [str(record / RUNS), str(record / HYPOTHESES_PACKED)]
    again = subprocess.run(
        [sys.executable, "scripts/keep_run.py", "--compact", str(record)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert again.returncode == 2 and "compact already" in again.stderr


def test_the_script_records_a_sweep_directory(tmp_path: Path) -> None:
    sweep = fake_sweep(tmp_path / "sweep")
    done = subprocess.run(
        [sys.executable, "scripts/keep_run.py", str(sweep), str(tmp_path / "rec")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert read_run(tmp_path / "rec" / "attention=lsh,seed=1").status == "failed"
    assert str(tmp_path / "rec" / "report.md") in done.stdout.splitlines()
    refused = subprocess.run(
        [sys.executable, "scripts/keep_run.py", str(sweep), str(tmp_path / "rec2"), "--extra", "x.hyp"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2 and "--extra names more files of a run" in refused.stderr


def test_unpack_writes_each_jobs_translations_where_its_directory_held_them(tmp_path: Path) -> None:
    keep_sweep(fake_sweep(tmp_path / "sweep"), tmp_path / "rec")
    keep_run(fake_run(tmp_path / "run"), tmp_path / "one")
    done = subprocess.run(
        [sys.executable, "scripts/keep_run.py", "--unpack-hyp", str(tmp_path / "rec"), str(tmp_path / "one")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    jobs = ("rec/attention=eager,seed=1", "rec/attention=linear,seed=1", "one")
    written = [tmp_path / job / "test.hyp" for job in jobs]
    assert done.stdout.splitlines() == list(map(str, written))
    assert all(path.read_text() == "ein Hund .\nzwei Katzen .\n" for path in written)
    assert read_run(tmp_path / "one").hypotheses == ["ein Hund .", "zwei Katzen ."]  # still the record


def test_a_run_kept_into_a_sweeps_record_is_one_of_its_jobs(tmp_path: Path) -> None:
    """docs/ablation.md adds late jobs so: keep_run.py RUN RECORD/JOB beside the record's packed jobs."""
    keep_sweep(fake_sweep(tmp_path / "sweep"), tmp_path / "rec")
    keep_run(fake_run(tmp_path / "late"), tmp_path / "rec" / "attention=sdpa,seed=1")
    names = [run.name for run in read_runs(tmp_path / "rec")]
    assert names == ["attention=eager,seed=1", "attention=linear,seed=1", "attention=lsh,seed=1",
                     "attention=sdpa,seed=1"]  # fmt: skip
    assert read_run(tmp_path / "rec" / "attention=sdpa,seed=1").status == "finished"
