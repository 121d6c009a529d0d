"""The attention benchmark (app.bench.attention, run by scripts/bench_attention.py) at tiny sizes:
every variant runs, the CSV and the plot appear, peak memory is measured or said to be unmeasured."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from app.bench import attention as bench
from app.bench.attention_cases import TRAIN_CASES, runnable, timed_row
from app.bench.attention_plot import series
from app.bench.memory import PEAK_UNMEASURED, parse_bytes, peak_bytes

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def test_tiny_run_writes_every_row_and_the_plot(tmp_path: Path) -> None:
    out_csv = tmp_path / "bench.csv"
    tiny = ["--d-model", "32", "--heads", "4", "--repeats", "1", "--warmup", "0"]
    bench.main([*tiny, "--lengths", "16", "32", "--decode-lengths", "4", "8", "--out-csv", str(out_csv)])
    with out_csv.open() as handle:
        rows = list(csv.DictReader(handle))
    train = [r for r in rows if r["bench"] == "train"]
    assert {r["variant"] for r in train} == {case.name for case in TRAIN_CASES}
    assert len(train) == 2 * len(TRAIN_CASES) and all(r["status"] == "ok" for r in train)
    assert all(float(r["time_ms"]) > 0 and int(r["peak_bytes"]) > 0 for r in train)
    cache = {(r["variant"], int(r["length"])): int(r["cache_bytes"]) for r in rows if r["mode"] == "cached"}
    assert cache[("mha_sdpa", 8)] == 2 * cache[("mha_sdpa", 4)] == 2 * 2 * 4 * 32 * 4  # K and V, float32
    assert cache[("gqa_sdpa_kv2", 8)] * 2 == cache[("mha_sdpa", 8)]  # 2 of 4 kv heads
    assert cache[("linear_elu", 4)] == cache[("linear_elu", 8)]  # a fixed-size state
    assert out_csv.with_suffix(".png").stat().st_size > 0


def test_estimate_skips_what_exceeds_the_memory_cap(tmp_path: Path) -> None:
    out_csv = tmp_path / "bench.csv"
    small = ["--d-model", "32", "--heads", "4", "--repeats", "1", "--warmup", "0", "--decode-lengths"]
    bench.main(
        [
            *small,
            "--variants",
            "eager",
            "sdpa",
            "--lengths",
            "8",
            "512",
            "--max-bytes",
            "2MiB",
            "--out-csv",
            str(out_csv),
        ]
    )
    with out_csv.open() as handle:
        status = {(r["variant"], r["length"]): r["status"] for r in csv.DictReader(handle)}
    assert status[("eager", "8")] == status[("sdpa", "8")] == status[("sdpa", "512")] == "ok"
    assert status[("eager", "512")].startswith("skipped: estimated")
    assert parse_bytes("4GiB") == 4 * 2**30 and parse_bytes("1e6") == 10**6


def test_kernel_only_times_every_kernel_without_projections(tmp_path: Path) -> None:
    out_csv = tmp_path / "kernels.csv"
    tiny = ["--d-model", "32", "--heads", "4", "--repeats", "1", "--warmup", "0", "--decode-lengths"]
    bench.main([*tiny, "--kernel-only", "--causal", "--lengths", "16", "--out-csv", str(out_csv)])
    with out_csv.open() as handle:
        rows = list(csv.DictReader(handle))
    causal_cases = {case.name for case in runnable(TRAIN_CASES, causal=True)}
    assert {r["variant"] for r in rows} == causal_cases  # every kernel that can be causal
    assert {case.name for case in TRAIN_CASES} - causal_cases == {"linformer_k256"}  # it mixes the future
    assert all(r["mode"] == "kernel fwd+bwd" and r["status"] == "ok" for r in rows)
    assert all(float(r["time_ms"]) > 0 and int(r["peak_bytes"]) > 0 for r in rows)


def test_cpu_peak_is_the_largest_total_alive_at_once() -> None:
    """Two 1 MB buffers alive together, then a third after both are freed: the peak is 2 MB, not 3."""

    def run() -> None:
        a = torch.empty(2**20, dtype=torch.uint8)
        b = torch.empty(2**20, dtype=torch.uint8)
        del a, b
        c = torch.empty(2**20, dtype=torch.uint8)
        del c

    peak = peak_bytes(run, torch.device("cpu"))
    assert 2 * 2**20 <= peak < 2 * 2**20 + 2**16


class _FreesBetweenChildren(torch.autograd.Function):
    """A backward pass that allocates and frees 1 MB four times inside one op (as a blockwise kernel does)."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        for _ in range(4):
            block = torch.empty(2**20, dtype=torch.uint8)
            del block
        return grad


def test_cpu_peak_counts_frees_when_they_happen_not_when_the_op_ends() -> None:
    x = torch.zeros(4, requires_grad=True)
    peak = peak_bytes(lambda: _FreesBetweenChildren.apply(x).sum().backward(), torch.device("cpu"))
    assert 2**20 <= peak < 2**20 + 2**16


def test_a_peak_that_cannot_be_measured_says_so() -> None:
    """Nothing allocated, nothing recorded: the cell and the status say 'not measured', never a blank."""
    peak = peak_bytes(lambda: None, torch.device("cpu"))
    assert peak is None
    row = {"variant": "v", "mode": "fwd+bwd", "length": "8", **timed_row(1.5, peak)}
    assert row["peak_bytes"] == PEAK_UNMEASURED and "not measured" in row["status"]
    assert series([row], "peak_bytes") == {}
    assert series([row], "time_ms") == {("v", "fwd+bwd"): [(8.0, 1.5)]}
