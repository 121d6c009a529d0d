"""app.reports.report / scripts/report.py on hand-made sweep dirs: rows, files, failures, determinism,
and the paired bootstrap against sacreBLEU's command line."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.training import REPO_ROOT

from app.reports.layout import HYPOTHESES_PACKED, RUNS
from app.reports.measurements import kv_cache_bytes_per_token
from app.reports.record import compact_record
from app.reports.report import write_report
from app.reports.runs import read_run
from app.reports.significance import paired_bootstrap
from app.training.sweep import clear_failure, record_child_failure

REFS = ["a dog runs in the park .", "two men sit on a bench .", "a woman reads a big book .", "kids play ."]
HYPS = {
    "mha": ["a dog runs in a park .", "two men sit on the bench .", "a woman reads a book .", "kids play ."],
    "gqa": ["the dog runs .", "two men sit .", "a woman is reading .", "children play ."],
}


def make_job(sweep: Path, variant: str, seed: int, *, finished: bool = True, log: str = "") -> Path:
    run = sweep / f"attention={variant},seed={seed}"
    (run / ".hydra").mkdir(parents=True)
    attention = (
        {"kernel": "eager", "num_kv_heads": None}
        if variant == "mha"
        else {"kernel": "sdpa", "num_kv_heads": 2}
    )
    model = {"family": "transformer", "d_model": 32, "num_heads": 4, "decoder_layers": 2}
    data = sweep.parent / "data"
    data.mkdir(exist_ok=True)
    (data / "test.de").write_text("\n".join(["x"] * len(REFS)) + "\n")
    (data / "test.en").write_text("\n".join(REFS) + "\n")
    files = {"test": {"src": str(data / "test.de"), "tgt": str(data / "test.en")}}
    config = {
        "seed": seed,
        "attention": attention,
        "model": model,
        "trainer": {"max_steps": 10},
        "data": {"files": files},
    }
    (run / ".hydra" / "config.yaml").write_text(json.dumps(config))
    (run / "csv").mkdir()
    rows = ["step,val/bleu,time/elapsed_min"] + [f"{s},{s * (2 + seed)},{s / 10}" for s in (5, 10)]
    (run / "csv" / "metrics.csv").write_text("\n".join(rows) + "\n")
    (run / "train.log").write_text(log)
    if finished:
        bleu = 40.0 + seed if variant == "mha" else 20.0 + seed
        results = {"parameters": 1000, "global_step": 10, "train_tokens_per_s": 500, "peak_rss_mb": 300,
                   "test_bleu": bleu, "test_bleu_lc": bleu + 1, "test_chrf": bleu + 10,
                   "machine": {"device": "cpu", "cpu_model": "Test CPU 9000", "threads": 2,
                               "torch": "2.x", "cpu_flags": []}}  # fmt: skip
        (run / "results.json").write_text(json.dumps(results))
        (run / "test.hyp").write_text("\n".join(HYPS[variant]) + "\n")
    return run


def report(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(REPO_ROOT / "scripts" / "report.py"), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_report_rows_files_and_a_failed_job(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    for variant in ("mha", "gqa"):
        for seed in (1, 2):
            make_job(sweep, variant, seed)
    make_job(sweep, "gqa", 3, finished=False, log="Traceback (most recent call last):\nRuntimeError: boom\n")
    (sweep / "multirun.yaml").write_text("hydra:\n  launcher:\n    n_jobs: 2\n")
    completed = report(str(sweep))
    assert completed.returncode == 0, completed.stderr
    for name in ("report.md", "report.html", "report.csv", "report.json", "group1_curves.png"):
        assert (sweep / name).is_file(), name
    with (sweep / "report.csv").open() as handle:
        rows = {row["variant"]: row for row in csv.DictReader(handle)}
    assert set(rows) == {"eager", "sdpa kv=2"}
    assert rows["eager"]["bleu"] == "41.5" and rows["eager"]["bleu_std"] == "0.71"
    model = {"family": "transformer", "d_model": 32, "num_heads": 4, "decoder_layers": 2}
    assert rows["sdpa kv=2"]["kv_bytes_per_token"] == str(
        kv_cache_bytes_per_token(model, {"num_kv_heads": 2})
    )
    assert kv_cache_bytes_per_token(model, {"num_kv_heads": 2}) == 2 * 2 * 2 * 8 * 4
    assert kv_cache_bytes_per_token(model, {"kernel": "eager"}, "bf16-true") == 2 * 2 * 4 * 8 * 2
    assert rows["sdpa kv=2"]["p_value"] and rows["eager"]["p_value"] == ""  # the baseline has none
    markdown = (sweep / "report.md").read_text()
    assert (
        "failed job" in markdown and "attention=gqa,seed=3" in markdown and "RuntimeError: boom" in markdown
    )
    headline = [line for line in markdown.splitlines() if line.startswith("| eager |")]
    assert len(headline) == 2 and headline[0].split(" | ")[4] == ""  # headline + full row; no delta
    sdpa = next(line for line in markdown.splitlines() if line.startswith("| sdpa kv=2 | "))
    assert " ± " in sdpa and sdpa.count(" | ") == 8  # the headline row comes first: 9 columns
    assert rows["sdpa kv=2"]["p_value_seeds"] and rows["eager"]["p_value_seeds"] == ""
    # the machine the runs recorded, not the one writing the report; the sweep's jobs at a time
    assert "- trained on: Test CPU 9000 (2 threads), torch 2.x; 2 job(s) at a time" in markdown
    assert "data:image/png;base64," in (sweep / "report.html").read_text()
    first = {p.name: p.read_bytes() for p in sweep.iterdir() if p.is_file()}
    assert report(str(sweep)).returncode == 0
    assert {p.name: p.read_bytes() for p in sweep.iterdir() if p.is_file()} == first  # byte-identical


def test_a_compacted_sweep_regenerates_the_same_report_byte_for_byte(tmp_path: Path) -> None:
    """docs/ablation/<sweep> keeps its jobs in two compact files: the report made from them is the one
    made from the job directories, failed job, significance tests and figures included."""
    sweep = tmp_path / "sweep"
    for variant in ("mha", "gqa"):
        for seed in (1, 2):
            make_job(sweep, variant, seed)
    make_job(sweep, "gqa", 3, finished=False, log="Traceback (most recent call last):\nRuntimeError: boom\n")
    written = write_report([sweep])
    from_directories = {path.name: path.read_bytes() for path in written}
    assert {"report.md", "report.csv", "group1_curves.png"} <= set(from_directories)
    for path in written:
        path.unlink()
    compact_record(sweep)
    assert sorted(p.name for p in sweep.iterdir()) == [HYPOTHESES_PACKED, RUNS]  # no job directory left
    assert {path.name: path.read_bytes() for path in write_report([sweep])} == from_directories


def test_single_seed_variants_have_no_std_and_say_so(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    make_job(sweep, "mha", 1)
    make_job(sweep, "gqa", 1)
    assert report(str(sweep)).returncode == 0
    assert "single seed (no std, no p-value): eager, sdpa kv=2" in (sweep / "report.md").read_text()
    rows = json.loads((sweep / "report.json").read_text())["rows"]
    assert all(row["bleu_std"] is None and row["p_value"] is None for row in rows)


def test_a_sweep_without_a_finished_job_is_a_clear_error(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    make_job(sweep, "mha", 1, finished=False, log="Epoch 0: 10%\n")
    completed = report(str(sweep))
    assert completed.returncode == 2
    assert f"no job in {sweep} finished" in completed.stderr and "missing" in completed.stderr


def test_paired_bootstrap_agrees_with_the_sacrebleu_command_line(tmp_path: Path) -> None:
    ref, base, system = tmp_path / "ref", tmp_path / "base", tmp_path / "sys"
    ref.write_text("\n".join(REFS * 5) + "\n")
    base.write_text("\n".join(HYPS["mha"] * 5) + "\n")
    system.write_text("\n".join(HYPS["gqa"] * 5) + "\n")
    command = [sys.executable, "-m", "sacrebleu", str(ref), "-i", str(base), str(system)]
    command += ["--paired-bs", "-m", "bleu", "-f", "json"]
    env = {"SACREBLEU_SEED": "12345", "PATH": ""}
    cli = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
    expected = json.loads(cli.stdout)[1]["BLEU"]  # the system's row
    ours = paired_bootstrap(HYPS["mha"] * 5, HYPS["gqa"] * 5, REFS * 5)
    assert round(ours["p_value"], 3) == pytest.approx(round(float(expected["p_value"]), 3))
    assert ours["score"] == pytest.approx(float(expected["score"]), abs=0.05)


def test_kv_bytes_per_token_follow_each_kernels_cache() -> None:
    """A causal window keeps window + 1 positions; linear attention a fixed state; RNNs have no KV cache."""
    model = {"family": "transformer", "d_model": 32, "num_heads": 4, "decoder_layers": 2}
    full = kv_cache_bytes_per_token(model, {"kernel": "eager"}, length=64)
    assert full == 2 * 2 * 4 * 8 * 4
    window = kv_cache_bytes_per_token(model, {"kernel": "sparse", "window": 7}, length=64)
    assert window == round(full * 8 / 64)
    assert kv_cache_bytes_per_token(model, {"kernel": "sparse", "window": 7}, length=8) == full
    linear_64 = kv_cache_bytes_per_token(model, {"kernel": "linear"}, length=64)
    assert linear_64 == round(kv_cache_bytes_per_token(model, {"kernel": "linear"}, length=32) / 2)
    assert kv_cache_bytes_per_token({"family": "rnn"}, {"mechanism": "additive"}) is None


def test_identical_outputs_are_not_significant() -> None:
    """sacreBLEU alone gives identical systems p = 1/1001; the report says p = 1."""
    ours = paired_bootstrap(HYPS["mha"] * 5, HYPS["mha"] * 5, REFS * 5, samples=100)
    assert ours["delta"] == 0 and ours["p_value"] == 1.0


def test_a_failed_file_marks_the_job_failed_with_its_error(tmp_path: Path) -> None:
    run = make_job(tmp_path / "sweep", "gqa", 1, finished=False, log="Epoch 0: 10%\n")
    assert read_run(run).status == "missing"
    error_output = (
        "Error executing job with overrides: ['heads.num_kv_heads=3']\nTraceback (most recent call last):\n"
        '  File "train.py", line 1, in <module>\nValueError: num_kv_heads=3 must divide num_heads=4\n\n'
        "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n"
    )
    record_child_failure(run, 1, error_output)
    failed = read_run(run)
    assert failed.status == "failed"
    assert failed.what_it_left().endswith("error: ValueError: num_kv_heads=3 must divide num_heads=4")
    clear_failure(run)  # a resumed sweep runs the job again
    assert read_run(run).status == "missing"


def headline_table(report_md: Path) -> str:
    """The first table of a committed report.md (its headline: one row per variant)."""
    text = report_md.read_text()
    start = text.index("| variant | params | steps |")
    return text[start : text.index("\n\n", start)]


@pytest.mark.parametrize(
    ("quoted_in", "sweep"),
    [
        ("docs/ablation.md", "transformer_gpu_2min"),
        ("docs/ablation.md", "transformer_cpu_4min"),
        ("docs/ablation.md", "rnn_3min"),
    ],
)
def test_the_docs_quote_the_committed_reports_as_written(quoted_in: str, sweep: str) -> None:
    """The ablation tables in the docs are the reports' headline tables, not hand-made copies."""
    table = headline_table(REPO_ROOT / "docs/ablation" / sweep / "report.md")
    assert table in (REPO_ROOT / quoted_in).read_text()
