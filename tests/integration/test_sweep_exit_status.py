"""``train.py -m`` tells a script or a scheduler that a job failed: a real Hydra sweep of two tiny jobs, one
of them failing on a bad config value, exits non-zero and names that job on its last line; the other job
finishes all the same."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.training import run_train, tiny_overrides, write_corpus_slice

from app.rundir import RunDir

SLICE = {"train": 200, "val": 10, "test_2016_flickr": 10}


@pytest.mark.slow
def test_a_sweep_with_a_failed_job_exits_non_zero_naming_it(multi30k_dir: Path, tmp_path: Path) -> None:
    corpus = write_corpus_slice(multi30k_dir, tmp_path / "corpus", SLICE)
    sweep = tmp_path / "sweep"
    tiny = [
        o
        for o in tiny_overrides(corpus, tmp_path / "unused", tmp_path / "cache")
        if not o.startswith(("output_dir=", "hydra.run.dir="))  # a sweep's jobs get their own dirs
    ]
    overrides = [
        "-m",
        *tiny,
        "data.subword.vocab_size=200",
        "trainer.max_time=null",
        "trainer.max_steps=2",
        "test_search.max_len=8",
        "valid_search.max_len=8",
        f"hydra.sweep.dir={sweep}",
        "heads.num_kv_heads=null,3",  # 3 does not divide model.num_heads=4: job 1 fails when it is built
    ]
    done = run_train(overrides, timeout=300, check=False)

    assert done.returncode != 0, done.stderr[-3000:]
    last_line = done.stderr.strip().splitlines()[-1]
    assert last_line == f"train.py -m: 1 job failed (see FAILED in each) in {sweep}: 1", done.stderr[-3000:]
    assert "num_kv_heads" in RunDir(sweep / "1").failed.read_text()
    assert RunDir(sweep / "0").results.is_file() and not RunDir(sweep / "0").failed.exists()
