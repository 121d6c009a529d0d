"""Smoke runs of scripts/bench_attention.py at tiny sizes: every variant runs, the CSV and the plot appear."""

from __future__ import annotations

import csv
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.usefixtures("single_torch_thread")

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location(
        "bench_attention", REPO_ROOT / "scripts" / "bench_attention.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the script runs
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def test_tiny_run_writes_every_row_and_the_plot(bench: ModuleType, tmp_path: Path) -> None:
    out_csv = tmp_path / "bench.csv"
    tiny = ["--d-model", "32", "--heads", "4", "--repeats", "1", "--warmup", "0"]
    bench.main([*tiny, "--lengths", "16", "32", "--decode-lengths", "4", "8", "--out-csv", str(out_csv)])
    with out_csv.open() as handle:
        rows = list(csv.DictReader(handle))
    train = [r for r in rows if r["bench"] == "train"]
    assert {r["variant"] for r in train} == {v.name for v in bench.VARIANTS}
    assert len(train) == 2 * len(bench.VARIANTS) and all(r["status"] == "ok" for r in train)
    assert all(float(r["time_ms"]) > 0 and int(r["peak_bytes"]) > 0 for r in train)
    cache = {(r["variant"], int(r["length"])): int(r["cache_bytes"]) for r in rows if r["mode"] == "cached"}
    assert cache[("mha_sdpa", 8)] == 2 * cache[("mha_sdpa", 4)] == 2 * 2 * 4 * 32 * 4  # K and V, float32
    assert cache[("gqa_sdpa_kv2", 8)] * 2 == cache[("mha_sdpa", 8)]  # 2 of 4 kv heads
    assert cache[("linear_elu", 4)] == cache[("linear_elu", 8)]  # a fixed-size state
    assert out_csv.with_suffix(".png").stat().st_size > 0


def test_estimate_skips_what_exceeds_the_memory_cap(bench: ModuleType, tmp_path: Path) -> None:
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
    assert bench.parse_bytes("4GiB") == 4 * 2**30 and bench.parse_bytes("1e6") == 10**6


def test_kernel_only_times_every_kernel_without_projections(bench: ModuleType, tmp_path: Path) -> None:
    out_csv = tmp_path / "kernels.csv"
    tiny = ["--d-model", "32", "--heads", "4", "--repeats", "1", "--warmup", "0", "--decode-lengths"]
    bench.main([*tiny, "--kernel-only", "--causal", "--lengths", "16", "--out-csv", str(out_csv)])
    with out_csv.open() as handle:
        rows = list(csv.DictReader(handle))
    assert {r["variant"] for r in rows} == {v.name for v in bench.VARIANTS}
    assert all(r["mode"] == "kernel fwd+bwd" and r["status"] == "ok" for r in rows)
    assert all(float(r["time_ms"]) > 0 and int(r["peak_bytes"]) > 0 for r in rows)
