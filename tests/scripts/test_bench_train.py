"""The training benchmark (scripts/bench_train.py) on a tiny config: it trains, times windows, counts
model FLOPs against a measured peak and reports memory; where the CPU has no fast bf16, no bf16 product
is run for a peak, which is reported as absent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.training import tiny_overrides, write_corpus_slice

import app.hardware
from app.bench import training as bench

PEAK = ["--peak-size", "512"]  # the peak's product: big enough to be steady, a 16th of 2048^2's work


@pytest.fixture
def avx2_only(monkeypatch: pytest.MonkeyPatch) -> list[torch.dtype]:
    """A CPU whose flags lack fast bf16 (an AVX2-only EPYC); returns the dtypes of every torch.matmul
    called meanwhile."""
    monkeypatch.setattr(app.hardware, "cpu_flags", lambda cpuinfo=None: frozenset({"sse2", "avx2", "fma"}))
    dtypes: list[torch.dtype] = []
    matmul = torch.matmul

    def spy(a: torch.Tensor, b: torch.Tensor, **kwargs: object) -> torch.Tensor:
        dtypes.append(a.dtype)
        return matmul(a, b, **kwargs)

    monkeypatch.setattr(torch, "matmul", spy)
    return dtypes


def bench_overrides(multi30k_dir: Path, tmp_path: Path, *extra: str) -> list[str]:
    """train.py overrides of a tiny model on a 300-pair corpus slice, without the run-directory ones."""
    corpus = write_corpus_slice(
        multi30k_dir, tmp_path / "m30k", {"train": 300, "val": 20, "test_2016_flickr": 10}
    )
    return [
        o
        for o in tiny_overrides(corpus, tmp_path / "unused", tmp_path / "cache", *extra)
        if not o.startswith(("hydra.", "output_dir="))
    ]


def test_bench_train_reports_median_throughput_and_memory(
    multi30k_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], avx2_only: list[torch.dtype]
) -> None:
    overrides = bench_overrides(multi30k_dir, tmp_path, "optim.fused=false")
    out = tmp_path / "bench.jsonl"
    args = [
        "--warmup-steps",
        "1",
        "--windows",
        "3",
        "--window-steps",
        "1",
        "--out",
        str(out),
        "--json",
        *PEAK,
    ]
    assert bench.main([*overrides[:-1], *args, overrides[-1], *PEAK]) == 0  # overrides around the options
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == json.loads(out.read_text())
    assert len(printed["tokens_per_s_windows"]) == 3
    assert sorted(printed["tokens_per_s_windows"])[1] == printed["tokens_per_s"] > 0
    assert 0 < printed["model_tflops"] < printed["peak_fp32_tflops"] * 1.5
    # mfu = model / peak before both were rounded to 4 decimals (model_tflops is ~0.001 for this model)
    model, peak, half = printed["model_tflops"], printed["peak_fp32_tflops"], 5e-5
    assert (model - half) / (peak + half) - half <= printed["mfu"] <= (model + half) / (peak - half) + half
    assert printed["cpu_model"] and printed["peak_fp32_tflops"] > 0
    assert printed["peak_bf16_tflops"] is None and printed["mfu_bf16"] is None  # no fast bf16: not measured
    assert torch.float32 in avx2_only and torch.bfloat16 not in avx2_only
    assert 0.3 < printed["real_token_fraction"] <= 1.0
    assert printed["peak_rss_mb"] > 0
    assert (printed["precision"], printed["fused_adamw"]) == ("32-true", False)


def test_profile_prints_the_operator_table_after_the_timed_windows(
    multi30k_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overrides = bench_overrides(multi30k_dir, tmp_path)
    args = ["--warmup-steps", "0", "--windows", "1", "--window-steps", "1", "--profile", "1", "--json", *PEAK]
    assert bench.main([*overrides, *args]) == 0
    captured = capsys.readouterr()
    printed = json.loads(captured.out.strip().splitlines()[-1])
    assert "profile" not in printed and len(printed["tokens_per_s_windows"]) == 1
    assert "torch.profiler, 1 steps after the timed windows" in captured.err
    assert "aten::mm" in captured.err and "Self CPU" in captured.err


def test_table_lists_each_configuration_of_each_file_with_its_runs_in_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def line(overrides: list[str], tokens: int, mfu: float) -> str:
        fields = {"tokens_per_s": tokens, "mfu_bf16": mfu, "peak_bf16_tflops": 0.5, "peak_rss_mb": 1200}
        return json.dumps({"overrides": overrides, **fields, "cpu_model": "Some CPU"})

    before, after = tmp_path / "before.jsonl", tmp_path / "after.jsonl"
    before.write_text(line(["experiment=a"], 100, 0.1) + "\n" + line(["experiment=b"], 50, 0.2) + "\n")
    after.write_text(line(["experiment=a"], 150, 0.15) + "\n\n" + line(["experiment=a"], 170, 0.17) + "\n")
    assert bench.main(["--table", str(before), str(after)]) == 0
    rows = capsys.readouterr().out.strip().splitlines()
    assert len(rows) == 5  # header, rule, three (file, overrides) rows
    assert rows[2] == "| before.jsonl | `experiment=a` | 100 | 10.0 | 0.500 | 1,200 | Some CPU |"
    assert rows[3].startswith("| before.jsonl | `experiment=b` | 50 | 20.0 |")
    assert rows[4].startswith("| after.jsonl | `experiment=a` | 150, 170 | 15.0, 17.0 |")


def test_the_summary_names_the_headline_figures() -> None:
    result = {
        "tokens_per_s": 1234,
        "model_tflops": 0.05,
        "mfu": 0.1,
        "peak_bf16_tflops": 1.0,
        "peak_fp32_tflops": 0.5,
        "threads": 2,
        "cpu_model": "Some CPU",
        "peak_rss_mb": 900,
    }
    line = bench.summary(result)
    assert "1,234 tokens/s" in line and "MFU 10.0%" in line and "Some CPU" in line


def test_without_fast_bf16_the_peak_and_mfu_against_it_are_absent(avx2_only: list[torch.dtype]) -> None:
    peaks = bench.peak_tflops(torch.device("cpu"), size=64)
    assert peaks["bf16"] is None and peaks["fp32"] > 0
    assert avx2_only == [torch.float32] * 8  # one warm-up and seven timed fp32 products, no bf16 one
    assert bench.best_peaks(peaks, {"bf16": None, "fp32": 2 * peaks["fp32"]}) == {
        "bf16": None,
        "fp32": 2 * peaks["fp32"],
    }
    result = {
        "tokens_per_s": 1234,
        "model_tflops": 0.05,
        "mfu": 0.1,
        "peak_bf16_tflops": None,
        "peak_fp32_tflops": 0.5,
        "threads": 2,
        "cpu_model": "Some CPU",
        "peak_rss_mb": 900,
    }
    assert "peaks bf16 n/a: no fast bf16 on this CPU / fp32 0.5 TFLOP/s" in bench.summary(result)
