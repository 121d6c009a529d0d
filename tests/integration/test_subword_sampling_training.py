"""``data.subword_sampling`` in a real training run: the same batches of the same sentences, read in other
segmentations, and a bad setting fails before training."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.training import compose_train, read_trace, tiny_overrides

from app.data.tokenizer import TokenizerError
from app.training.task import train

STEPS = 6


def traced_run(corpus: Path, tmp_path: Path, name: str, *extra: str) -> list[dict]:
    trace = tmp_path / f"{name}.jsonl"
    overrides = tiny_overrides(
        corpus,
        tmp_path / name,
        tmp_path / "cache",
        f"trainer.max_steps={STEPS}",
        "trainer.limit_val_batches=0",
        "early_stopping.patience=0",
        f"debug.trace_batches={trace}",
        *extra,
    )
    train(compose_train(overrides))
    return read_trace(trace)


def test_sampling_changes_the_segmentations_not_the_batches(corpus_slice: Path, tmp_path: Path) -> None:
    plain = traced_run(corpus_slice, tmp_path, "plain")
    sampled = traced_run(
        corpus_slice,
        tmp_path,
        "sampled",
        "data.subword_sampling.nbest_size=8",
        "data.subword_sampling.alpha=0.2",
    )
    assert [r["ids"] for r in sampled] == [r["ids"] for r in plain]  # batching stays on one-best lengths
    assert all(s["tokens"] != p["tokens"] for s, p in zip(sampled, plain, strict=True))
    again = traced_run(
        corpus_slice,
        tmp_path,
        "again",
        "data.subword_sampling.nbest_size=8",
        "data.subword_sampling.alpha=0.2",
    )
    assert [r["tokens"] for r in again] == [r["tokens"] for r in sampled]  # reproducible from the seed


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.subword_sampling.nbest_size=1", r"data.subword_sampling.nbest_size must be 0 \(off\)"),
        ("+data.subword.vocab=8", r"unknown key\(s\) \['vocab'\] in data.subword; valid keys"),
    ],
)
def test_a_bad_subword_setting_fails_before_training(
    corpus_slice: Path, tmp_path: Path, override: str, message: str
) -> None:
    overrides = tiny_overrides(corpus_slice, tmp_path / "run", tmp_path / "cache", override)
    with pytest.raises(TokenizerError, match=message):
        train(compose_train(overrides))
    assert not (tmp_path / "run" / "checkpoints").exists()
