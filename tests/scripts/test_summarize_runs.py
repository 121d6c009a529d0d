"""scripts/summarize_runs.py: one Markdown row per run, unfinished runs listed, bad paths refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from app.reports.record import compact_record

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "summarize_runs.py"


def make_run(run_dir: Path, config: str, results: dict | None) -> Path:
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text(config)
    if results is not None:
        (run_dir / "results.json").write_text(json.dumps(results))
    return run_dir


def summarize(*runs: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, runs)], capture_output=True, text=True)


def test_rows_for_finished_and_unfinished_runs(tmp_path: Path) -> None:
    results = {
        "parameters": 7_578_624,
        "test_bleu": 37.77,
        "test_bleu_lc": 38.012,
        "test_chrf": 57.16,
        "global_step": 1593,
        "fit_seconds": 3600.0,
        "train_tokens_per_s": 5123,
        "test_decode_sentences_per_s": 41.26,
        "peak_rss_mb": 2319,
        "test_bleu_moses_lc": 38.104,
        "checkpoint": "runs/gqa/checkpoints/averaged.ckpt",
        "beam": 8,
        "alpha": 1.0,
    }
    gqa = make_run(
        tmp_path / "gqa",
        "model: {family: transformer}\nattention: {kernel: sdpa, num_kv_heads: 2}\n",
        results,
    )
    rnn = make_run(
        tmp_path / "rnn",
        "model: {family: rnn, cell: lstm}\nattention: {mechanism: general, decoder: luong}\n",
        None,
    )
    lines = summarize(gqa, rnn).stdout.splitlines()
    scores = "7.58M | 37.77 | 38.01 | 57.2 | 1593 | 60.0 | 5,123 | 41.3 | 2,319"
    decoding = "38.10 | averaged, beam 8, alpha 1.0"
    assert lines[2] == f"| gqa | transformer | sdpa kv=2 | {scores} | {decoding} |"
    assert lines[3].startswith("| rnn | rnn lstm | luong general | unfinished |")
    assert len(lines) == 4
    compact_record(tmp_path)  # the two runs as one compact record: one row per job, the same rows
    assert summarize(tmp_path).stdout.splitlines() == lines


def test_a_directory_that_is_not_a_run_is_named(tmp_path: Path) -> None:
    completed = summarize(tmp_path)
    assert completed.returncode != 0
    assert str(tmp_path) in completed.stderr
