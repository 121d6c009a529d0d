"""``data.concat=K`` end to end: training on joined examples, then the long test outputs scored whole and
split back into sentences, in results.json beside the usual keys."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from helpers.training import compose_train, tiny_overrides

from app.data.corpus import read_parallel
from app.training.task import train

K = 4


@pytest.mark.slow
def test_a_run_on_joined_examples_scores_them_whole_and_split(corpus_slice: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(
        corpus_slice,
        run_dir,
        tmp_path / "cache",
        f"data.concat={K}",
        "data.max_len=160",
        "model.max_positions=200",
        "trainer.max_steps=8",
        "trainer.val_check_interval=8",
        "test_search.max_len=200",
        "valid_search.max_len=200",
    )
    results = train(compose_train(overrides))
    test = read_parallel(corpus_slice / "test_2016_flickr.de", corpus_slice / "test_2016_flickr.en")
    examples = math.ceil(len(test) / K)
    assert results["test_split_examples"] == examples
    assert 0 <= results["test_split_matched"] <= examples
    assert results["test_split_sentences"] <= len(test)
    assert (run_dir / "test.hyp").read_text(encoding="utf-8").count("\n") == examples  # one line an example
    assert json.loads((run_dir / "results.json").read_text())["test_split_examples"] == examples
