"""The training benchmark (scripts/bench_train.py) on a tiny config: it trains, times windows, counts
model FLOPs against a measured peak and reports memory; where the CPU has no fast bf16, no bf16 product
is run for a peak, which is reported as absent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from helpers.training import tiny_overrides, write_corpus_slice

import app.hardware
from app.bench import training as bench
from app.bench.gpu_report import bench_rows
from app.training.task import build_fit

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
    assert 0 < printed["target_tokens_per_s"] < printed["tokens_per_s"]  # the target side's share
    assert printed["warmup_s"] > 0  # first batch to the end of the untimed step
    assert sorted(printed["tokens_per_s_windows"])[1] == printed["tokens_per_s"] > 0
    assert 0 < printed["model_tflops"] < printed["peak_fp32_tflops"] * 1.5
    # mfu and model_tflops unrounded (a tiny model's would round to 0); the peak printed to 4 decimals
    peak = printed["peak_fp32_tflops"]  # rounded to 4 decimals: on a busy machine a small peak's rounding
    rounding = 0.5e-4 / peak  # is most of the gap between mfu and model_tflops / printed peak
    assert printed["mfu"] == pytest.approx(printed["model_tflops"] / peak, rel=1e-3 + rounding)
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
        fields |= {"target_tokens_per_s": tokens // 2, "model_tflops": 0.5 * mfu}
        return json.dumps({"overrides": overrides, **fields, "cpu_model": "Some CPU"})

    before, after = tmp_path / "before.jsonl", tmp_path / "after.jsonl"
    before.write_text(line(["experiment=a"], 100, 0.1) + "\n" + line(["experiment=b"], 50, 0.2) + "\n")
    after.write_text(line(["experiment=a"], 150, 0.15) + "\n\n" + line(["experiment=a"], 170, 0.17) + "\n")
    assert bench.main(["--table", str(before), str(after)]) == 0
    rows = capsys.readouterr().out.strip().splitlines()
    assert len(rows) == 5  # header, rule, three (file, overrides) rows
    assert rows[0].startswith(
        "| file | overrides | tokens/s | target tokens/s | achieved TFLOP/s | MFU vs bf16"
    )
    assert rows[2] == (
        "| before.jsonl | `experiment=a` | 100 | 50 | 0.050 | 10.0 | 0.500 | 1,200 |  | cpu | Some CPU |"
    )
    assert rows[3].startswith("| before.jsonl | `experiment=b` | 50 | 25 | 0.100 | 20.0 |")
    assert rows[4].startswith(
        "| after.jsonl | `experiment=a` | 150, 170 | 75, 85 | 0.075, 0.085 | 15.0, 17.0 |"
    )


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
    assert "1,234 tokens/s, achieved 0.05 TFLOP/s, MFU 10.0%" in line and "Some CPU" in line
    assert "1,234 tokens/s (617 target), " in bench.summary(result | {"target_tokens_per_s": 617})


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


class OutOfMemoryAtFirstStep(pl.Callback):
    """Raises the error a GPU raises when an allocation fails, from inside the real training loop."""

    def on_train_batch_start(self, *args: object) -> None:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB\nmore text")


def test_running_out_of_memory_is_a_result_listed_as_oom(
    multi30k_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def build_fit_that_runs_out(cfg: object) -> object:
        run = build_fit(cfg)
        run.trainer.callbacks.append(OutOfMemoryAtFirstStep())
        return run

    monkeypatch.setattr(bench, "build_fit", build_fit_that_runs_out)
    overrides = bench_overrides(multi30k_dir, tmp_path)
    out = tmp_path / "oom.jsonl"
    args = ["--warmup-steps", "0", "--windows", "1", "--window-steps", "1", "--out", str(out), *PEAK]
    assert bench.main([*overrides, *args]) == 0  # a finding, not a failure of the benchmark
    assert "out of memory: CUDA out of memory. Tried to allocate 64.00 GiB (cpu, " in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["overrides"] == overrides and result["cpu_model"] and "tokens_per_s" not in result
    with out.open("a") as handle:  # a configuration that fitted, beside it in the same file
        handle.write(json.dumps({"overrides": ["x=1"], "tokens_per_s": 10, "peak_cuda_mb": 512}) + "\n")
    assert bench.main(["--table", str(out)]) == 0
    rows = capsys.readouterr().out.strip().splitlines()
    assert rows[2].startswith(f"| oom.jsonl | `{' '.join(overrides)}` | OOM |  |  |  |  |  |  | cpu |")
    assert rows[3] == "| oom.jsonl | `x=1` | 10 |  |  |  |  |  | 512 | cpu |  |"


def test_an_error_that_is_not_out_of_memory_still_fails(
    multi30k_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def build_fit_that_breaks(cfg: object) -> object:
        run = build_fit(cfg)
        run.trainer.callbacks.append(Breaks())
        return run

    class Breaks(pl.Callback):
        def on_train_batch_start(self, *args: object) -> None:
            raise RuntimeError("a bug, not a limit")

    monkeypatch.setattr(bench, "build_fit", build_fit_that_breaks)
    args = ["--warmup-steps", "0", "--windows", "1", "--window-steps", "1", *PEAK]
    with pytest.raises(RuntimeError, match="a bug, not a limit"):
        bench.main([*bench_overrides(multi30k_dir, tmp_path), *args])


def test_comma_separated_values_sweep_like_train_multirun() -> None:
    assert bench.sweep(["experiment=x", "attention=eager,sdpa", "data.concat=1,64", "a.b=[c,d]", "~x.y"]) == [
        ["experiment=x", "attention=eager", "data.concat=1", "a.b=[c,d]", "~x.y"],
        ["experiment=x", "attention=eager", "data.concat=64", "a.b=[c,d]", "~x.y"],
        ["experiment=x", "attention=sdpa", "data.concat=1", "a.b=[c,d]", "~x.y"],
        ["experiment=x", "attention=sdpa", "data.concat=64", "a.b=[c,d]", "~x.y"],
    ]
    assert bench.sweep(["+extra=1,2"]) == [["+extra=1"], ["+extra=2"]]


def test_a_sweep_measures_each_configuration_in_turn_and_with_keep_going_outlives_a_failed_one(
    multi30k_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each configuration measured and printed as it ends. With --keep-going (what the GPU check's sweeps
    use) one that cannot run, here a kernel that is not there, is written as an error, the next one is
    still measured, and the exit status says one failed; the GPU check's report reads the lines."""
    overrides = bench_overrides(multi30k_dir, tmp_path)
    out = tmp_path / "sweep.jsonl"
    args = ["--warmup-steps", "0", "--windows", "1", "--window-steps", "1", "--out", str(out), *PEAK]
    sweep = [*overrides, "optim.fused=false", "attention=eager,no_such_kernel,sdpa", "--keep-going", *args]
    assert bench.main(sweep) == 1
    eager, failed, sdpa = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["attention"]["kernel"] for r in (eager, sdpa)] == ["eager", "sdpa"]
    assert [r["overrides"][-1] for r in (eager, sdpa)] == ["attention=eager", "attention=sdpa"]
    assert eager["tokens_per_s"] > 0 and sdpa["tokens_per_s"] > 0
    assert "no_such_kernel" in failed["error"] and "tokens_per_s" not in failed
    captured = capsys.readouterr()
    assert captured.out.count(" tokens/s (") == 2  # one summary line each, as each ends
    assert "no_such_kernel" in captured.err  # the traceback, for whoever reads the log
    assert bench.main(["--table", str(out)]) == 0
    assert "| failed |" in capsys.readouterr().out
    rows = bench_rows([out])  # as the GPU check's report reads them
    assert [r["attention"] for r in rows] == ["eager", "no_such_kernel", "sdpa"] and "error" in rows[1]
    assert rows[0]["x_eager"] == 1.0 and rows[2]["x_eager"] == round(
        sdpa["tokens_per_s"] / eager["tokens_per_s"], 3
    )
    assert rows[0]["target_tokens_per_s"] == eager["target_tokens_per_s"] and rows[0]["mfu"] == eager["mfu"]
    assert 0 < eager["target_tokens_per_s"] < eager["tokens_per_s"]
