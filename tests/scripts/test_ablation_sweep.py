"""The ablation as one command, for real: ``train.py -m experiment=ablation`` trains every job (one of
them failing at build time), the sweep's end writes the report that names the failed job, and then the
sweep exits non-zero naming it too."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
from helpers.training import run_train, tiny_overrides, write_corpus_slice

from app.reports.report import write_report
from app.rundir import RunDir

SLICE = {"train": 400, "val": 30, "test_2016_flickr": 20}


@pytest.mark.slow
def test_one_command_sweep_reports_finished_and_failed_jobs(multi30k_dir: Path, tmp_path: Path) -> None:
    corpus = write_corpus_slice(multi30k_dir, tmp_path / "corpus", SLICE)
    sweep = tmp_path / "sweep"
    tiny = [
        o
        for o in tiny_overrides(corpus, tmp_path / "unused", tmp_path / "cache")
        if not o.startswith(("output_dir=", "hydra.run.dir="))  # a sweep's jobs get their own dirs
    ]
    fixed = [*tiny, "trainer.max_time=null", "trainer.max_steps=8", "trainer.val_check_interval=4"]
    # job dirs are named by the overrides; leave the fixed ones out, as the sweep's own keys are
    exclude = ["experiment", "hydra.sweep.dir", *(o.split("=", 1)[0] for o in fixed)]
    overrides = [
        "-m",
        "experiment=ablation",
        *fixed,
        f"hydra.sweep.dir={sweep}",
        f"hydra.job.config.override_dirname.exclude_keys=[{','.join(exclude)}]",
        "hydra.callbacks.ablation_report.decode_limit=5",
        "attention=eager,sdpa",
        "heads.num_kv_heads=null,3",  # 3 does not divide model.num_heads=4: those jobs fail when built
        "seed=1,2",
    ]
    done = run_train(overrides, timeout=600, check=False)
    assert done.returncode == 1, done.stderr[-4000:]  # the sweep went on, then said that jobs failed
    failed_names = [
        f"attention={kernel},heads.num_kv_heads=3,seed={seed}"
        for kernel in ("eager", "sdpa")
        for seed in (1, 2)
    ]
    last_line = done.stderr.strip().splitlines()[-1]
    assert last_line == f"train.py -m: 4 jobs failed (see FAILED in each) in {sweep}: " + ", ".join(
        failed_names
    )
    for name in failed_names:  # each failed job's own record says why; the finished jobs have none
        assert "num_kv_heads" in RunDir(sweep / name).failed.read_text(), name
    finished = [RunDir(path.parent) for path in sweep.glob("*/results.json")]
    assert len(finished) == 4 and not any(run.failed.exists() for run in finished)

    for name in ("report.md", "report.html", "report.csv", "report.json", "group1_curves.png"):
        assert (sweep / name).is_file(), name
    assert (sweep / "group1_bleu_vs_speed.png").is_file() and (sweep / "group1_attention.png").is_file()
    with (sweep / "report.csv").open() as handle:
        rows = {row["variant"]: row for row in csv.DictReader(handle)}
    assert set(rows) == {"eager", "sdpa"}
    for row in rows.values():
        assert row["seeds"] == "2" and row["bleu"] != "" and row["bleu_std"] != ""
        assert int(row["kv_bytes_per_token"]) == 2 * 4 * 8 * 4  # k+v, 4 heads, head_dim 8, fp32; 1 layer
        assert float(row["decode_sent_s_greedy"]) > 0
    assert rows["eager"]["p_value"] == "" and rows["sdpa"]["p_value"] != ""  # eager is the baseline

    failed = json.loads((sweep / "report.json").read_text())["incomplete"]
    assert sorted(Path(job["path"]).name for job in failed) == failed_names
    assert {job["status"] for job in failed} == {"failed"}
    markdown = (sweep / "report.md").read_text()
    assert (
        "failed job" in markdown and "num_kv_heads" in markdown and "heads.num_kv_heads=3,seed=1" in markdown
    )

    # a copy without checkpoints (as committed under docs/ablation/) regenerates the same table and figures
    copy = tmp_path / "copy"
    shutil.copytree(sweep, copy, ignore=shutil.ignore_patterns("checkpoints"))
    write_report([copy])
    for name in ("report.csv", "group1_curves.png", "group1_bleu_vs_speed.png", "group1_attention.png"):
        assert (copy / name).read_bytes() == (sweep / name).read_bytes(), name
