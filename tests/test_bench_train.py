"""scripts/bench_train.py on a tiny config: it trains, times windows and reports memory."""

from __future__ import annotations

import json
from importlib import util
from pathlib import Path

import pytest
from training_helpers import REPO_ROOT, tiny_overrides, write_corpus_slice


def test_bench_train_reports_median_throughput_and_memory(
    multi30k_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = util.spec_from_file_location("bench_train", REPO_ROOT / "scripts" / "bench_train.py")
    bench = util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    corpus = write_corpus_slice(
        multi30k_dir, tmp_path / "m30k", {"train": 300, "val": 20, "test_2016_flickr": 10}
    )
    overrides = [
        o
        for o in tiny_overrides(corpus, tmp_path / "unused", tmp_path / "cache", "optim.fused=false")
        if not o.startswith(("hydra.", "output_dir="))
    ]
    out = tmp_path / "bench.jsonl"
    args = ["--warmup-steps", "2", "--windows", "3", "--window-steps", "2", "--out", str(out)]
    assert bench.main([*overrides, *args]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == json.loads(out.read_text())
    assert len(printed["tokens_per_s_windows"]) == 3
    assert sorted(printed["tokens_per_s_windows"])[1] == printed["tokens_per_s_median"] > 0
    assert 0.3 < printed["real_token_fraction"] <= 1.0
    assert printed["peak_rss_mb"] > 0
    assert (printed["precision"], printed["fused_adamw"], printed["attention"]) == ("32-true", False, "eager")
